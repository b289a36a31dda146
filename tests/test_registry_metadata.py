"""What `comfy node publish` reads and validates before it uploads Ferry to the Comfy Registry,
checked here (docs.comfy.org registry/specifications; comfy-cli's extract_node_configuration and
validate_node_for_publishing), plus the release workflow that runs it.

- [project] name: the node id, < 100 characters, letters/digits/-/_/. only, no two special
  characters in a row, starting with a letter; "ComfyUI" is not part of it.
- [project] version: semantic X.Y.Z; license {file = …} or {text = …}; urls.Repository.
- [tool.comfy] PublisherId (required), DisplayName, Icon: a URL to an SVG/PNG/JPG/GIF of at most
  800 x 400 px (here: a file in this repository, at the URL its Repository serves it from).
- The security scan: ruff's S102 (exec) and S307 (eval) find nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from tests.conftest import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (3.10 has no TOML reader)
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT: dict[str, Any] = PYPROJECT["project"]
COMFY: dict[str, Any] = PYPROJECT["tool"]["comfy"]
WORKFLOW = REPO / ".github" / "workflows" / "publish_action.yml"


def test_the_node_id_follows_the_registry_rules() -> None:
    name = PROJECT["name"]
    assert len(name) < 100
    assert re.fullmatch(r"[A-Za-z][A-Za-z0-9]*(?:[-_.][A-Za-z0-9]+)*", name), name
    assert "comfyui" not in name.lower()


def test_version_license_and_repository() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", PROJECT["version"]), PROJECT["version"]
    lic = PROJECT["license"]
    assert isinstance(lic, dict) and (lic.get("text") or (REPO / lic.get("file", "-")).is_file())
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", PROJECT["urls"]["Repository"])


def test_the_publisher_and_display_name_are_set() -> None:
    assert re.fullmatch(r"[a-z0-9][a-z0-9-]*", COMFY["PublisherId"]), COMFY["PublisherId"]
    assert COMFY["DisplayName"].startswith("Ferry")
    assert re.fullmatch(r">=\d+\.\d+\.\d+", COMFY["requires-comfyui"])


def _svg_size(text: str) -> tuple[float, float]:
    root = ET.fromstring(text)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    # Self-contained: no script, no image or link pulled from elsewhere.
    for el in root.iter():
        assert not el.tag.endswith(("script", "image", "foreignObject")), el.tag
        assert not any("href" in k for k in el.attrib), el.attrib
    _, _, w, h = (float(v) for v in root.attrib["viewBox"].split())
    return float(root.attrib.get("width", w)), float(root.attrib.get("height", h))


def test_the_icon_is_a_file_here_at_the_url_the_registry_gets() -> None:
    icon = COMFY["Icon"]
    owner_repo = PROJECT["urls"]["Repository"].removeprefix("https://github.com/")
    prefix = f"https://raw.githubusercontent.com/{owner_repo}/main/"
    assert icon.startswith(prefix), icon
    path = REPO / icon.removeprefix(prefix)
    assert path.suffix in (".svg", ".png", ".jpg", ".gif") and path.is_file(), path
    if path.suffix == ".svg":
        w, h = _svg_size(path.read_text())
    else:
        from PIL import Image

        w, h = Image.open(path).size
    assert 0 < w <= 800 and 0 < h <= 400, (w, h)


def test_the_security_scan_finds_no_exec_or_eval() -> None:
    ruff = shutil.which("ruff") or sys.executable
    cmd = [ruff] if ruff != sys.executable else [ruff, "-m", "ruff"]
    out = subprocess.run(
        [*cmd, "check", ".", "-q", "--select", "S102,S307", "--exit-zero", "--no-cache"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", out.stdout


def test_the_changelog_has_the_version_being_published() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(PROJECT['version'])}\]", text, flags=re.M), text[:300]


def test_the_release_workflow_publishes_on_a_version_change() -> None:
    yaml = pytest.importorskip("yaml")
    wf = yaml.safe_load(WORKFLOW.read_text())
    on = wf[True] if True in wf else wf["on"]  # YAML 1.1 reads the key `on` as true
    assert on["push"]["branches"] == ["main"] and on["push"]["paths"] == ["pyproject.toml"]
    assert "workflow_dispatch" in on
    (job,) = wf["jobs"].values()
    steps = job["steps"]
    publish = next(s for s in steps if str(s.get("uses", "")).startswith("Comfy-Org/publish-node"))
    assert publish["uses"] == "Comfy-Org/publish-node-action@v1"
    assert publish["with"]["personal_access_token"] == "${{ secrets.REGISTRY_ACCESS_TOKEN }}"
    # It publishes only when [project] version differs from the commit before (or by hand).
    check = next(s for s in steps if s.get("id") == "version")
    assert "HEAD^:pyproject.toml" in check["run"] and '["project"]["version"]' in check["run"]
    assert "steps.version.outputs.changed == 'true'" in publish["if"]
    checkout = next(s for s in steps if str(s.get("uses", "")).startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] >= 2


def test_the_version_check_tells_a_change_from_none(tmp_path: Any) -> None:
    # The workflow's own shell step, run against a two-commit repository.
    yaml = pytest.importorskip("yaml")
    wf = yaml.safe_load(WORKFLOW.read_text())
    (job,) = wf["jobs"].values()
    script = next(s for s in job["steps"] if s.get("id") == "version")["run"]

    def commit(version: str, msg: str) -> None:
        (tmp_path / "pyproject.toml").write_text(
            f'[project]\nname = "ferry"\nversion = "{version}"\n'
        )
        git("add", "pyproject.toml")
        git("commit", "-qm", msg)

    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True
        )

    def changed() -> bool:
        out = tmp_path / "out"
        out.write_text("")
        env = {
            "PATH": f"{sys.executable.rsplit('/', 1)[0]}:/usr/bin:/bin",
            "GITHUB_OUTPUT": str(out),
        }
        subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, env=env, check=True, capture_output=True
        )
        return "changed=true" in out.read_text()

    git("init", "-q")
    commit("0.1.0", "first")
    assert changed()  # no version before: the first release publishes
    (tmp_path / "pyproject.toml").write_text((tmp_path / "pyproject.toml").read_text() + "# x\n")
    git("commit", "-qam", "a comment only")
    assert not changed()
    commit("0.2.0", "bump")
    assert changed()
