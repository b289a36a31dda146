"""Starts Ferry's panel on the built-in demo model and prints its URL (the README's main job).

Loaded by AUTOMATIC1111/Forge as an extension script (they import every scripts/*.py), it
adds the panel as a tab instead, where their Gradio can draw it (web/panel/a1111.py).

    python scripts/panel.py                  # http://127.0.0.1:7860/ , opens a browser tab
    python scripts/panel.py --port 7870 --no-browser
    python scripts/panel.py --listen 0.0.0.0 # other machines too: prints a warning

The pack is imported the way ComfyUI imports it (from its folder, under a hyphenated name),
so the panel runs the same relative-import code standalone and inside ComfyUI.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACK_NAME = "ferry-panel-standalone"


def load_pack_package() -> str:
    """Registers the repository root as a package WITHOUT running its __init__.py.

    The root __init__ registers ComfyUI nodes, which a standalone panel does not need (and
    which may import ComfyUI-only modules); the panel's own modules are imported from it.
    """
    if PACK_NAME not in sys.modules:
        pkg = types.ModuleType(PACK_NAME)
        pkg.__path__ = [str(REPO)]
        pkg.__file__ = str(REPO / "__init__.py")
        sys.modules[PACK_NAME] = pkg
    return PACK_NAME


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Ferry's panel on the built-in demo model.")
    ap.add_argument(
        "--port", type=int, default=None, help="port (default: the first free from 7860)"
    )
    ap.add_argument(
        "--listen", metavar="ADDRESS", default=None,
        help="listen on ADDRESS (e.g. 0.0.0.0) instead of 127.0.0.1: other machines can then "
        "change your settings; prints a warning",
    )  # fmt: skip
    ap.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    ap.add_argument(
        "--size-gb", type=float, default=0.25, help="demo model size in GB (default 0.25)"
    )
    ap.add_argument(
        "--settings",
        default=None,
        help="settings file (default: $FERRY_SETTINGS or the per-user file)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    panel = importlib.import_module(load_pack_package() + ".web.panel")
    errors = importlib.import_module(PACK_NAME + ".offload_core.errors")
    host = args.listen or "127.0.0.1"
    try:
        url = panel.launch_panel(
            host, args.port, allow_remote=args.listen is not None,
            demo_size_gb=args.size_gb, settings_path=args.settings,
        )  # fmt: skip
    except errors.ConfigError as e:
        print(f"ferry panel: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a busy port
        print(f"ferry panel: cannot listen on {host}:{args.port}: {e}; try --port", file=sys.stderr)
        return 2
    print(f"Ferry panel: {url}", flush=True)
    if not args.no_browser:
        import webbrowser

        webbrowser.open(url)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        panel.close_panel()
    return 0


def _a1111_entry() -> None:
    """A1111/Forge import this file to register UI tabs; anywhere else this does nothing."""
    try:
        from modules import script_callbacks  # type: ignore[import-not-found]
    except ImportError:
        return
    import gradio

    a1111 = importlib.import_module(load_pack_package() + ".web.panel.a1111")
    a1111.register_tab(script_callbacks, gradio.__version__)


if __name__ == "__main__":
    raise SystemExit(main())
else:
    _a1111_entry()
