"""The Registry package as the real installer makes it: comfy-cli's `comfy node validate` and
`comfy node pack` (the pinned version in requirements-comfycli.txt, in its own venv, which
`bash run.sh test` makes and names in FERRY_COMFY_CLI), then the zip's file list.

The zip must hold every file a user runs (the pack in ComfyUI, the WebUI extension, the
standalone panel, the templates and locales, the install hook, the metadata, LICENSE and
README) and nothing else: no tests, benchmarks, CI or developer requirement files. Whatever is
not on the allowed list below fails the test, so a new top-level file is a decision, made in
.comfyignore or here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

#: Folders whose every file a user runs (ComfyUI loads the pack's __init__.py, nodes/, seam/,
#: offload_core/ and web/; a WebUI loads scripts/ and webui/; ComfyUI reads example_workflows/
#: as templates and locales/ for the node labels).
USER_FOLDERS = (
    "nodes",
    "seam",
    "offload_core",
    "web",
    "webui",
    "scripts",
    "locales",
    "example_workflows",
)
#: Single files a user runs or reads. install.py: ComfyUI-Manager and a WebUI run it;
#: tools/panel.py + tools/pack_loader.py: the standalone panel, which scripts/ferry_webui.py
#: also loads.
USER_FILES = (
    "__init__.py",
    "install.py",
    "requirements.txt",
    "pyproject.toml",
    "LICENSE",
    "README.md",
    "CHANGELOG.md",
    "tools/panel.py",
    "tools/pack_loader.py",
)
#: Documentation the README links to (text; its screenshots stay on the repository's page).
USER_DOCS = re.compile(r"docs/[^/]+\.md")
#: What must never be in the package.
NOT_SHIPPED = re.compile(
    r"(tests|bench|\.ci|\.github|docs/img)/.*|requirements-.*\.txt|run\.sh|constraints\.txt|\.gitignore"
)


def _comfy_cli() -> Path:
    named = os.environ.get("FERRY_COMFY_CLI")
    found = Path(named) if named else REPO / ".venv-comfycli" / "bin" / "comfy"
    if not found.is_file():
        pytest.skip(
            f"comfy-cli is not installed ({found} is missing): `bash run.sh test` installs "
            "requirements-comfycli.txt into .venv-comfycli, or set FERRY_COMFY_CLI to a `comfy`"
        )
    return found


def _tree_files() -> list[str]:
    """The files the next commit holds: tracked plus untracked-but-not-ignored (so a new file
    counts before it is added; a fresh clone, as CI has, holds exactly the tracked ones)."""
    if not (REPO / ".git").exists():
        pytest.skip(f"{REPO} is not a git checkout: comfy node pack packs git-tracked files")
    out = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    return sorted({f for f in out.split("\0") if f and (REPO / f).is_file()})


def _comfy(cli: Path, where: Path, home: Path, *args: str) -> str:
    # --skip-prompt and --no-enable-telemetry: no question on a first run; HOME: its config
    # (~/.config/comfy-cli) goes into the test's folder; DO_NOT_TRACK: no telemetry at all.
    env = {**os.environ, "HOME": str(home), "DO_NOT_TRACK": "1", "NO_COLOR": "1"}
    done = subprocess.run(
        [str(cli), "--skip-prompt", "--no-enable-telemetry", "node", *args],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"comfy node {' '.join(args)} failed:\n{output}"
    return output


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[zipfile.ZipFile, str, int]:
    """(the zip comfy node pack made, validate's output, the zip's size in bytes), made from a
    git repository holding a copy of this tree (so the test writes nothing into the checkout)."""
    cli = _comfy_cli()
    files = _tree_files()
    root = tmp_path_factory.mktemp("registry")
    tree, home = root / "ferry", root / "home"
    home.mkdir()
    for rel in files:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tree / rel)
    git = ["git", "-c", "init.defaultBranch=main", "-C", str(tree)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    validated = _comfy(cli, tree, home, "validate")
    _comfy(cli, tree, home, "pack")
    zip_path = tree / "node.zip"
    assert zip_path.is_file(), f"comfy node pack wrote no {zip_path}"
    return zipfile.ZipFile(zip_path), validated, zip_path.stat().st_size


def test_comfy_node_validate_passes_with_no_security_warning(
    packed: tuple[zipfile.ZipFile, str, int],
) -> None:
    _, validated, _ = packed
    assert "All validation checks passed" in validated, validated
    assert "Security warnings" not in validated, validated


def test_the_package_holds_every_file_a_user_runs(
    packed: tuple[zipfile.ZipFile, str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    zf, _, size = packed
    names = set(zf.namelist())
    wanted = {f for f in _tree_files() if f in USER_FILES or f.split("/", 1)[0] in USER_FOLDERS}
    assert set(USER_FILES) <= wanted, f"missing from the tree: {set(USER_FILES) - wanted}"
    missing = sorted(wanted - names)
    assert not missing, f"the Registry package lacks files a user runs: {missing}"
    with capsys.disabled():
        print(f"\nregistry package (comfy node pack): {len(names)} files, {size} bytes")


def test_the_package_holds_nothing_else(packed: tuple[zipfile.ZipFile, str, int]) -> None:
    zf, _, _ = packed
    names = zf.namelist()
    leaked = [n for n in names if NOT_SHIPPED.fullmatch(n)]
    assert not leaked, f"the Registry package holds test/bench/dev files (.comfyignore): {leaked}"
    allowed = set(USER_FILES)
    other = [
        n
        for n in names
        if n not in allowed
        and n.split("/", 1)[0] not in USER_FOLDERS
        and not USER_DOCS.fullmatch(n)
    ]
    assert not other, (
        f"files in the Registry package that no user runs: {other}; leave them out in "
        ".comfyignore, or add them to this test's USER_FILES if a user needs them"
    )


def test_the_license_file_is_the_apache_license_pyproject_declares() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]
    assert declared == {"text": "Apache-2.0"}, declared
    text = (REPO / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    # The full text (11,358 bytes as the ASF publishes it), not an excerpt.
    assert len(text) > 11_000, len(text)
