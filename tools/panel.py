"""Starts Ferry's panel on the built-in demo model and prints its URL (the README's main job).

The WebUI side (a Forge/A1111 tab) is scripts/ferry_webui.py: those hosts load every
scripts/*.py as a WebUI script, so only WebUI scripts live there.

    python tools/panel.py                    # http://127.0.0.1:7860/ , opens a browser tab
    python tools/panel.py --port 7870 --no-browser
    python tools/panel.py --listen 0.0.0.0   # other machines too: prints a warning

The pack is imported the way ComfyUI imports it (from its folder, under a hyphenated name),
so the panel runs the same relative-import code standalone and inside ComfyUI.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

from pack_loader import PACK_NAME, load_pack_package


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
        "--size-gb", type=float, default=0.25, help="demo model size in GiB (default 0.25)"
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


if __name__ == "__main__":
    raise SystemExit(main())
