"""Ferry's node schemas without ComfyUI: each node's ``define_schema()`` run against a recording
stand-in of ``comfy_api.latest.io``, in a fresh interpreter (the stand-ins never reach the test
process's sys.modules).

What ComfyUI itself would list at run time is marked, not guessed: a Combo of files
(``folder_paths.get_filename_list``) records ``"files": <folder>``; a CLIP loader's ``type`` list
is core v0.33.0's (``CORE_CLIP_TYPES``, read from its nodes.py). The real-ComfyUI suite checks the
same nodes against the running server's /object_info (tests/comfyui/test_comfyui_frontend.py).

    python -m tests.node_schemas              prints the schemas as JSON
    python -m tests.node_schemas --en-locale  writes locales/en/nodeDefs.json from them
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap
from typing import Any

from tests.conftest import REPO

#: core v0.33.0's CLIPLoader / DualCLIPLoader ``type`` lists (nodes.py).
CORE_CLIP_TYPES = {
    "CLIPLoader": [
        "stable_diffusion", "stable_cascade", "sd3", "stable_audio", "mochi", "ltxv", "pixart",
        "cosmos", "lumina2", "wan", "hidream", "chroma", "ace", "omnigen2", "qwen_image",
        "hunyuan_image", "flux2", "ovis", "longcat_image", "cogvideox", "lens", "pixeldit",
        "ideogram4", "boogu", "krea2", "joyimage", "mage", "minimax",
    ],
    "DualCLIPLoader": [
        "sdxl", "sd3", "flux", "hunyuan_video", "hidream", "hunyuan_image", "hunyuan_video_15",
        "kandinsky5", "kandinsky5_image", "ltxv", "newbie", "ace",
    ],
}  # fmt: skip

#: The kinds of input that are widgets (a value in the node), not links.
WIDGET_KINDS = ("COMBO", "INT", "FLOAT", "STRING", "BOOLEAN")

_STANDIN = r"""
import importlib.util, json, sys, types
from unittest import mock

class FileList(list):
    def __init__(self, folder):
        super().__init__()
        self.folder = folder

def _input(kind):
    class Input:
        def __init__(self, id, optional=False, tooltip=None, **kw):
            self.rec = {"name": id, "kind": kind, "optional": optional, "tooltip": tooltip}
            for k in ("default", "min", "max", "step"):
                if k in kw:
                    self.rec[k] = kw[k]
            opts = kw.get("options")
            if isinstance(opts, FileList):
                self.rec["files"] = opts.folder
            elif opts is not None:
                self.rec["options"] = list(opts)
    class Output:
        def __init__(self, id=None, display_name=None, tooltip=None, **kw):
            self.rec = {"kind": kind, "name": id, "tooltip": tooltip}
    return type(kind, (), {"Input": Input, "Output": Output})

io = types.ModuleType("comfy_api.latest.io")
for attr, kind in [("Combo", "COMBO"), ("Int", "INT"), ("Float", "FLOAT"), ("String", "STRING"),
                   ("Boolean", "BOOLEAN"), ("Model", "MODEL"), ("Clip", "CLIP"), ("Vae", "VAE"),
                   ("AnyType", "*"), ("Latent", "LATENT"), ("Image", "IMAGE"),
                   ("ControlNet", "CONTROL_NET"), ("ClipVision", "CLIP_VISION")]:
    setattr(io, attr, _input(kind))
io.Custom = _input  # a type by its name: MODEL_PATCH (core's class name differs by version)
io.Input = object
# Hidden inputs (the queued prompt, the node's id) are no widgets: named, not recorded.
io.Hidden = types.SimpleNamespace(prompt="PROMPT", unique_id="UNIQUE_ID")
class Schema:
    def __init__(self, node_id, display_name, category, description, inputs, outputs,
                 is_output_node=False, **kw):
        self.rec = {"node_id": node_id, "display_name": display_name, "category": category,
                    "description": description, "output_node": is_output_node,
                    "inputs": [i.rec for i in inputs], "outputs": [o.rec for o in outputs]}
io.Schema = Schema
io.ComfyNode = type("ComfyNode", (), {})
io.NodeOutput = object
latest = types.ModuleType("comfy_api.latest")
latest.io, latest.ui = io, mock.MagicMock()
latest.ComfyExtension = type("ComfyExtension", (), {})
sys.modules.update({"comfy_api": types.ModuleType("comfy_api"), "comfy_api.latest": latest,
                    "comfy_api.latest.io": io})

folder_paths = types.ModuleType("folder_paths")
folder_paths.get_filename_list = FileList
folder_paths.get_full_path = lambda *a: None
folder_paths.get_temp_directory = lambda: "/tmp"
sys.modules["folder_paths"] = folder_paths
core_nodes = types.ModuleType("nodes")
for loader, types_ in CLIP_TYPES.items():
    inputs = {"required": {"type": (types_,)}, "optional": {"device": (["default", "cpu"],)}}
    setattr(core_nodes, loader, type(loader, (), {"INPUT_TYPES": staticmethod(lambda i=inputs: i)}))
# core's CheckpointLoaderSimple (v0.33.0's nodes.py): its ckpt_name, a file of checkpoints.
ckpt = {"required": {"ckpt_name": (FileList("checkpoints"),
                                   {"tooltip": "The name of the checkpoint (model) to load."})}}
core_nodes.CheckpointLoaderSimple = type("CheckpointLoaderSimple", (),
                                         {"INPUT_TYPES": staticmethod(lambda: ckpt)})
sys.modules["nodes"] = core_nodes
for name in ("comfy", "comfy.model_patcher", "comfy.utils", "comfy.patcher_extension",
             "comfy.float", "comfy.lora", "comfy.model_detection", "comfy.model_management",
             "comfy.sd", "server", "aiohttp"):
    sys.modules[name] = mock.MagicMock(name=name)

spec = importlib.util.spec_from_file_location(
    "ferry-schemas", REPO + "/__init__.py", submodule_search_locations=[REPO])
pack = importlib.util.module_from_spec(spec)
sys.modules["ferry-schemas"] = pack
spec.loader.exec_module(pack)
ext = importlib.import_module("ferry-schemas.nodes.extension")
"""


@functools.cache
def node_schemas() -> dict[str, dict[str, Any]]:
    """{node id: {display_name, category, description, output_node, inputs, outputs}}, the
    inputs in declaration order (required and optional as declared, which is the order of a
    UI workflow's ``widgets_values``)."""
    code = (
        f"REPO = {str(REPO)!r}\nCLIP_TYPES = {CORE_CLIP_TYPES!r}\nimport importlib\n"
        + _STANDIN
        + textwrap.dedent(
            """
            import asyncio
            nodes = asyncio.run(ext.FerryExtension.get_node_list(ext.FerryExtension()))
            out = {}
            for n in nodes:
                rec = n.define_schema().rec
                out[rec.pop("node_id")] = rec
            print(json.dumps(out))
            """
        )
    )
    env = {"PATH": "/usr/bin:/bin", "TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=REPO, env=env
    )
    if out.returncode != 0:
        raise RuntimeError(f"define_schema() under the stand-in failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def widgets(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The node's widget inputs, in the order the frontend keeps their values: the required
    ones, then the optional ones (ComfyUI's ``input_order``), each as declared."""
    ws = [i for i in schema["inputs"] if i["kind"] in WIDGET_KINDS]
    return [w for w in ws if not w["optional"]] + [w for w in ws if w["optional"]]


def en_node_defs(schemas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """locales/en/nodeDefs.json as the Python definitions say it (they are the one source of
    the English names, descriptions and tooltips; the frontend's format: inputs by name,
    outputs by index)."""
    out: dict[str, Any] = {}
    for nid, s in schemas.items():
        inputs = {i["name"]: {"name": i["name"], "tooltip": i["tooltip"]} for i in s["inputs"]}
        # An output with no name of its own is labelled by its type, as the frontend shows it.
        outputs = {
            str(k): {"name": o["name"] or o["kind"], "tooltip": o["tooltip"]}
            for k, o in enumerate(s["outputs"])
        }
        entry = {"display_name": s["display_name"], "description": s["description"]}
        out[nid] = {**entry, "inputs": inputs, "outputs": outputs}
    return out


def dump(data: Any) -> str:
    """JSON as the locale files keep it (UTF-8 text, two-space indent, final newline)."""
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--en-locale"]:
        path = REPO / "locales" / "en" / "nodeDefs.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump(en_node_defs(node_schemas())), encoding="utf-8")
        print(f"wrote {path}")
    else:
        print(dump(node_schemas()), end="")
