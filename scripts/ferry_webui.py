"""Ferry's WebUI script: Forge (and A1111) load every scripts/*.py of an extension as one.

Inside Forge it adds the "Ferry offload" accordion to txt2img and img2img (the class below,
which the WebUI finds in this module), the Ferry tab (the panel) and ``GET /ferry/stats``; in a
WebUI without Forge's backend or on a Gradio too old for the panel, a notice instead
(webui/entry.py). Outside a WebUI importing it does nothing. The pack is imported through
tools/pack_loader.py, as the standalone panel imports it: its code uses relative imports only.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path


def _pack_name() -> str:
    path = Path(__file__).resolve().parents[1] / "tools" / "pack_loader.py"
    spec = importlib.util.spec_from_file_location("ferry_pack_loader", path)
    assert spec is not None and spec.loader is not None
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    return str(loader.load_pack_package())


def _load() -> type | None:
    try:
        from modules import script_callbacks  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return None  # not inside a WebUI: import nothing of the pack
    entry = importlib.import_module(_pack_name() + ".webui.entry")
    return entry.load()  # type: ignore[no-any-return]


#: The "Ferry offload" scripts.Script subclass in Forge; None elsewhere.
FerryOffloadScript = _load()
