"""The Registry package in a real ComfyUI: the zip comfy-cli's `comfy node pack` makes (as
tests/test_registry_pack.py makes it: the pinned comfy-cli, a git copy of this tree), unpacked into
a fresh base directory's custom_nodes/ComfyUI-Ferry (a plain folder, no link to this checkout),
as ComfyUI-Manager or `comfy node install` unpacks a Registry download; ComfyUI starts, imports it
without error and lists every node the pack declares (nodes/extension.py, read without ComfyUI by
tests/node_schemas.py), and Ferry's routes answer.

    FERRY_COMFYUI=/work/comfy/v0.33.0 [FERRY_COMFY_CLI=/path/to/comfy] \\
        pytest tests/comfyui/test_comfyui_registry_zip.py
"""

from __future__ import annotations

import json
import urllib.request
import zipfile
from collections.abc import Iterator

import pytest
from conftest import Server, comfy_checkout, start_server, stop_server

from tests.node_schemas import node_schemas
from tests.test_registry_pack import packed  # noqa: F401  (the module fixture: the packed zip)

FOLDER = "ComfyUI-Ferry"  # the folder the Registry installers unpack Ferry into


@pytest.fixture(scope="module")
def unpacked_server(
    packed: tuple[zipfile.ZipFile, str, int],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Server]:
    comfy, py = comfy_checkout()
    zf, _, _ = packed
    base = tmp_path_factory.mktemp("zip-base")
    target = base / "custom_nodes" / FOLDER
    target.mkdir(parents=True)
    zf.extractall(target)
    srv = start_server(comfy, py, base)
    try:
        yield srv
    finally:
        stop_server(srv)


def _get(srv: Server, path: str) -> object:
    with urllib.request.urlopen(srv.url + path, timeout=60) as r:
        return json.loads(r.read())


def test_the_unpacked_zip_is_a_plain_folder_with_the_pack_in_it(unpacked_server: Server) -> None:
    target = unpacked_server.base / "custom_nodes" / FOLDER
    assert not target.is_symlink() and (target / "__init__.py").is_file()
    assert not (target / "tests").exists(), "the Registry zip must not carry the tests"


def test_comfyui_imports_the_unpacked_pack_without_error(unpacked_server: Server) -> None:
    text = unpacked_server.log.read_text(errors="replace")
    target = str(unpacked_server.base / "custom_nodes" / FOLDER)
    # ComfyUI's import-times list names each pack once: "0.1 seconds: <path>", or
    # "0.1 seconds (IMPORT FAILED): <path>" (core's own comfy_extras may fail here: spandrel).
    timed = [line for line in text.splitlines() if "seconds" in line and line.endswith(target)]
    assert timed, unpacked_server.log_tail()
    assert not any("IMPORT FAILED" in line for line in timed), timed


def test_every_declared_ferry_node_is_listed(unpacked_server: Server) -> None:
    declared = set(node_schemas())
    info = _get(unpacked_server, "/object_info")
    assert isinstance(info, dict)
    listed = {name for name, spec in info.items() if spec.get("python_module", "").endswith(FOLDER)}
    assert declared, "node_schemas() found no Ferry node"
    assert declared <= set(info), f"not listed by the server: {sorted(declared - set(info))}"
    assert listed == declared, (sorted(listed), sorted(declared))


def test_ferrys_routes_answer_from_the_unpacked_pack(unpacked_server: Server) -> None:
    stats = _get(unpacked_server, "/ferry/stats")
    assert isinstance(stats, dict) and stats, stats
    # The frontend's script comes from the unpacked folder too (WEB_DIRECTORY = web/comfyui).
    url = f"{unpacked_server.url}/extensions/{FOLDER}/ferry.js"
    with urllib.request.urlopen(url, timeout=30) as r:
        assert b"registerExtension" in r.read()
