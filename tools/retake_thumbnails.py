"""Retakes the templates' thumbnails (example_workflows/<name>.jpg) in ComfyUI's real frontend.

Starts a real ComfyUI headless on the CPU with a fresh base directory (as the real-ComfyUI
suite makes one: this repository linked as custom_nodes/ComfyUI-Ferry, a stand-in file under
each model name the templates use, ComfyUI-GGUF linked for template 02), opens its frontend in
Debian's chromium, loads each template the way the Templates browser does, and screenshots the
graph on the canvas with its widgets as shipped (tests/comfyui/frontend_page.thumbnail: fitted,
padded square, 512 px JPEG). A template that loads with a missing node or a red input is not
photographed: the run stops and names it.

    .venv/bin/python tools/retake_thumbnails.py --comfyui /work/comfy/v0.33.0 \\
        --gguf /work/comfy/ComfyUI-GGUF [--only 01_model_bigger_than_gpu] [--out DIR]

Needs the playwright package and /usr/bin/chromium (tests/comfyui/frontend_page.CHROMIUM).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: The frontend's settings the thumbnails are taken with (as tests/comfyui/test_comfyui_frontend.py
#: sets them): no tutorial over the canvas, no minimap over the graph, English labels, every
#: node's text drawn however small.
SETTINGS = {
    "Comfy.TutorialCompleted": True,
    "Comfy.Minimap.Visible": False,
    "Comfy.Locale": "en",
    "LiteGraph.Canvas.MinFontSizeForLOD": 1,
}


def _args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--comfyui", required=True, type=Path, help="a ComfyUI checkout with venv/")
    ap.add_argument("--gguf", type=Path, help="a ComfyUI-GGUF checkout (template 02 needs it)")
    ap.add_argument("--only", action="append", default=[], help="a template name (repeatable)")
    ap.add_argument("--out", type=Path, default=REPO / "example_workflows", help="where to write")
    ap.add_argument(
        "--node-shots",
        type=Path,
        help="also write each Ferry node at 1.5x zoom here (<template>-<node id>.png), to read "
        "its widgets, which a 512 px thumbnail draws too small to read",
    )
    return ap.parse_args(argv)


#: Puts the Ferry node ``id`` at the canvas's top-left at 1.5x and returns its box on the page.
NODE_BOX_JS = """(id) => {
  const app = window.comfyAPI.app.app;
  const n = app.graph.getNodeById(id);
  const title = window.LiteGraph.NODE_TITLE_HEIGHT;
  app.canvas.ds.scale = 1.5;
  app.canvas.ds.offset = [40 - n.pos[0], 100 + title - n.pos[1]];  // below the canvas toolbar
  app.canvas.setDirty(true, true);
  app.canvas.draw(true, true);
  const r = app.canvas.canvas.getBoundingClientRect();
  const a = app.canvas.ds.convertOffsetToCanvas([n.pos[0], n.pos[1] - title]);
  const b = app.canvas.ds.convertOffsetToCanvas([n.pos[0] + n.size[0], n.pos[1] + n.size[1]]);
  return { x: r.left + a[0] - 8, y: r.top + a[1] - 8, width: b[0] - a[0] + 16,
           height: b[1] - a[1] + 16 };
}"""
#: The Ferry nodes of the loaded graph: id, type and each widget's value as the canvas draws it.
FERRY_NODES_JS = """() => window.comfyAPI.app.app.graph.nodes
  .filter((n) => n.type.startsWith("Ferry"))
  .map((n) => ({ id: n.id, type: n.type,
                 widgets: (n.widgets || []).map((w) => [w.name, w.value]) }))"""


def _node_shots(page: Any, name: str, where: Path) -> None:
    """Each Ferry node of the loaded graph, zoomed, as a PNG; its widgets printed."""
    where.mkdir(parents=True, exist_ok=True)
    for node in page.evaluate(FERRY_NODES_JS):
        page.wait_for_timeout(300)
        box = page.evaluate(NODE_BOX_JS, node["id"])
        page.wait_for_timeout(300)
        shot = where / f"{name}-{node['id']}.png"
        page.screenshot(path=str(shot), clip=box)
        values = " ".join(f"{k}={v!r}" for k, v in node["widgets"])
        print(f"  {shot.name}: {node['type']} {values}")


GRAPH_TYPES_JS = "() => window.comfyAPI.app.app.graph.nodes.map((n) => n.type)"


def _load(page: Any, path: Path, load_template: Any) -> list[dict[str, Any]]:
    """Loads the template and makes sure the canvas still holds it a moment later: on a fresh
    page the frontend can finish restoring its own start-up workflow after the first load and
    put that on the canvas instead (seen here: template 01's thumbnail showed another graph)."""
    expected = sorted(n["type"] for n in json.loads(path.read_text())["nodes"])
    for _ in range(3):
        nodes: list[dict[str, Any]] = load_template(page, path.stem)
        page.wait_for_timeout(2000)
        if sorted(page.evaluate(GRAPH_TYPES_JS)) == expected:
            return nodes
    sys.exit(f"{path.stem}: the canvas does not keep the template's graph; nothing written")


def _problems(nodes: list[dict[str, Any]]) -> list[str]:
    """The nodes the frontend could not build (missing type) or flagged (red input)."""
    return [
        f"{n['type']} ({'not registered' if not n['registered'] else 'red input'})"
        for n in nodes
        if not n["registered"] or n["errors"]
    ]


def main(argv: list[str]) -> int:
    args = _args(argv)
    if not (args.comfyui / "main.py").is_file():
        sys.exit(f"--comfyui {args.comfyui}: no main.py there; give a ComfyUI checkout")
    if args.gguf is not None and not (args.gguf / "__init__.py").is_file():
        sys.exit(f"--gguf {args.gguf}: no __init__.py there; give a ComfyUI-GGUF checkout")
    # The suite's helpers read the checkout from FERRY_COMFYUI when imported.
    os.environ["FERRY_COMFYUI"] = str(args.comfyui)
    sys.path[:0] = [str(REPO / "tests" / "comfyui"), str(REPO)]
    from conftest import comfy_checkout, make_base, run_maker, start_server, stop_server
    from frontend_page import (
        CHROMIUM,
        FLAGS,
        close_dialogs,
        load_template,
        open_frontend,
        set_setting,
        thumbnail,
    )
    from playwright.sync_api import sync_playwright

    from tests.template_graph import template_paths

    paths = [p for p in template_paths() if not args.only or p.stem in args.only]
    unknown = set(args.only) - {p.stem for p in paths}
    if unknown:
        sys.exit(f"--only {sorted(unknown)}: no such template in example_workflows/")
    comfy, py = comfy_checkout()
    with tempfile.TemporaryDirectory(prefix="ferry-thumbnails-") as tmp:
        base = Path(tmp)
        make_base(base, py, comfy)
        # The template makers size their stand-ins after the tiny text encoders.
        run_maker(base, py, comfy, "make_text_encoders.py")
        run_maker(base, py, comfy, "make_template_models.py", *map(str, paths))
        if args.gguf is not None:
            (base / "custom_nodes" / "ComfyUI-GGUF").symlink_to(args.gguf.resolve())
        srv = start_server(comfy, py, base)
        try:
            for key, value in SETTINGS.items():
                set_setting(srv.url, key, value)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                page = browser.new_page(viewport={"width": 1100, "height": 1000})
                page.set_default_timeout(60_000)
                open_frontend(page, srv.url)
                for path in paths:
                    problems = _problems(_load(page, path, load_template))
                    close_dialogs(page)
                    if problems:
                        hint = "" if args.gguf else " (give --gguf for ComfyUI-GGUF's node)"
                        sys.exit(f"{path.stem}: {', '.join(problems)}{hint}; nothing written")
                    out = args.out / f"{path.stem}.jpg"
                    thumbnail(page, out)
                    print(f"{out}: {out.stat().st_size} bytes")
                    if args.node_shots is not None:
                        _node_shots(page, path.stem, args.node_shots)
                browser.close()
        finally:
            stop_server(srv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
