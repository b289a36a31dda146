"""Shared test fixtures.

offload_core is imported top-level (pyproject's pythonpath). The pack itself (nodes/, web/)
is imported as a package the way ComfyUI imports it: from its folder, under a name that is not
a valid identifier, so a stray absolute import breaks the tests as it would break ComfyUI.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")

REPO = Path(__file__).resolve().parents[1]
PACK_NAME = "ferry-pack-under-test"


def load_pack() -> ModuleType:
    """Imports the repository root as a package named with hyphens, as ComfyUI-Manager does."""
    if PACK_NAME in sys.modules:
        return sys.modules[PACK_NAME]
    spec = importlib.util.spec_from_file_location(
        PACK_NAME, REPO / "__init__.py", submodule_search_locations=[str(REPO)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACK_NAME] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def pack() -> ModuleType:
    return load_pack()
