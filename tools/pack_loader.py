"""Imports this repository as a package the way ComfyUI does, without running its __init__.py.

The root __init__ registers ComfyUI nodes, which a standalone panel or a WebUI does not need
(and which may import ComfyUI-only modules); their modules are imported from the package it
registers, so the same relative-import code runs standalone, in ComfyUI and in a WebUI. The
name is hyphenated, as ComfyUI-Manager names the pack's folder.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACK_NAME = "ferry-panel-standalone"


def load_pack_package() -> str:
    """Registers the repository root as the package PACK_NAME; returns that name."""
    if PACK_NAME not in sys.modules:
        pkg = types.ModuleType(PACK_NAME)
        pkg.__path__ = [str(REPO)]
        pkg.__file__ = str(REPO / "__init__.py")
        sys.modules[PACK_NAME] = pkg
    return PACK_NAME
