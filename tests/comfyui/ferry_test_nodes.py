"""A test-only ComfyUI node pack (copied into the test's custom_nodes folder, never shipped).

ComfyUI core has no node that makes CONDITIONING without a text encoder; this one makes a
seeded random one shaped for the tiny SD3 model (context 8 tokens x 32, pooled 32) by default,
or for another model (the architecture sweep's); and an empty LATENT of any shape.

It also injects the faults of tests/comfyui/test_comfyui_faults.py inside the server process,
armed over HTTP (``POST /ferry_test/arm`` {"fault": ..., ...}; ``GET /ferry_test/state`` says
which fired; ``POST /ferry_test/disarm``). Each acts at the operating-system boundary, where
the real fault happens, never inside Ferry:
- "eio": the next ``count`` ``os.preadv`` calls on a file under ``folder`` raise
  ``OSError(EIO)``. This is exactly what a failing disk gives: the kernel's preadv returns -EIO
  for a sector it cannot read, and Python raises OSError(errno.EIO) from os.preadv, with no
  bytes delivered. (A real one needs device-mapper's error target, which this kernel lacks:
  /dev/mapper/control does not exist.)
- "fill": once the first group file under ``folder`` is renamed into place (``os.replace``),
  another writer fills the filesystem: ``ballast`` is allocated with every free byte. The next
  group file's write then meets the real filesystem's ENOSPC: the disk fills mid-layout.
- "block": the ``at``-th call of an MMDiT JointBlock (a block Ferry streams) raises
  RuntimeError once, from inside the block's forward, while Ferry's group is in place.
"""

import errno
import functools
import inspect
import json
import os
import threading

import comfy.sd
import torch
from aiohttp import web
from comfy.ldm.modules.diffusionmodules import mmdit
from server import PromptServer


class FerryTestConditioning:
    @classmethod
    def INPUT_TYPES(cls):
        size = {"min": 0, "max": 65536}
        return {
            "required": {"seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1})},
            "optional": {  # the architecture sweep's models take other widths
                "tokens": ("INT", {"default": 8, **size}),
                "dim": ("INT", {"default": 32, **size}),
                "pooled": ("INT", {"default": 32, **size}),  # 0: no pooled_output
                "attention_mask": ("BOOLEAN", {"default": False}),  # all ones (LTXV asks)
                # more tensors a model's conditioning carries, as JSON {name: shape}: random
                # ({"conditioning_mt5xl": [1, 8, 2048]}), or all ones ("ones:1,8")
                "extra": ("STRING", {"default": "{}"}),
            },
        }

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, seed, tokens=8, dim=32, pooled=32, attention_mask=False, extra="{}"):
        g = torch.Generator().manual_seed(seed)
        context = torch.randn(1, tokens, dim, generator=g)
        out = {"pooled_output": torch.randn(1, pooled, generator=g)} if pooled else {}
        if attention_mask:
            out["attention_mask"] = torch.ones(1, tokens, dtype=torch.long)
        for name, shape in sorted(json.loads(extra).items()):
            if isinstance(shape, str):  # "ones:1,8"
                out[name] = torch.ones([int(n) for n in shape.split(":")[1].split(",")])
            else:
                out[name] = torch.randn(shape, generator=g)
        return ([[context, out]],)


class FerryTestLatent:
    """An empty latent of any shape ("16,1,8,8": channels, [frames,] height, width), batch 1."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"shape": ("STRING", {"default": "16,16,16"})}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, shape):
        return ({"samples": torch.zeros([1, *(int(n) for n in shape.split(","))])},)


class FerryTestPlainClone:
    """A node of a pack that hands on a clone of core's own patcher class, whatever class its
    input had (a pack that builds its patcher after cloning): Ferry's hold is lost here."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "plain"
    CATEGORY = "testing"

    def plain(self, model):
        import comfy.model_patcher

        n = model.clone()
        n.__class__ = comfy.model_patcher.ModelPatcher
        return (n,)


class FerryTestHold:
    """An output node that only takes a loader's network: a prompt of a loader and this runs
    the loader alone, and ComfyUI's cache keeps what it loaded (test_comfyui_loader_costs.py
    measures a loader's RAM so)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"optional": {"model": ("MODEL",), "clip": ("CLIP",)}}

    RETURN_TYPES = ()
    FUNCTION = "hold"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def hold(self, model=None, clip=None):
        return {}


class FerryTestSaveConditioning:
    """Saves a CONDITIONING's tensors (each entry's context and every tensor in its dict) to
    output/<filename_prefix>.safetensors, so a test compares them bit for bit."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "conditioning": ("CONDITIONING",),
                "filename_prefix": ("STRING", {"default": "ferry-cond"}),
            }
        }

    RETURN_TYPES = ()
    FUNCTION = "save"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def save(self, conditioning, filename_prefix):
        import folder_paths
        from safetensors.torch import save_file

        out = {}
        for i, (context, extra) in enumerate(conditioning):
            out[f"{i}.context"] = context.contiguous()
            for k, v in extra.items():
                if isinstance(v, torch.Tensor):
                    out[f"{i}.{k}"] = v.contiguous()
        name = f"{filename_prefix}.safetensors"
        os.makedirs(folder_paths.get_output_directory(), exist_ok=True)
        save_file(out, os.path.join(folder_paths.get_output_directory(), name))
        return {"ui": {"conditioning": [{"filename": name}]}}


class FerryTestSaveImage:
    """Saves an IMAGE's tensor to output/<filename_prefix>.safetensors (SaveImage's PNG keeps 8
    bits a channel: two images a bit apart can save the same file)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "images": ("IMAGE",),
                "filename_prefix": ("STRING", {"default": "ferry-image"}),
            }
        }

    RETURN_TYPES = ()
    FUNCTION = "save"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def save(self, images, filename_prefix):
        import folder_paths
        from safetensors.torch import save_file

        name = f"{filename_prefix}.safetensors"
        os.makedirs(folder_paths.get_output_directory(), exist_ok=True)
        save_file(
            {"images": images.contiguous()}, os.path.join(folder_paths.get_output_directory(), name)
        )
        return {"ui": {"tensors": [{"filename": name}]}}


class FerryTestDynamoGraphs:
    """Passes a LATENT on and prints how many graphs torch.compile (dynamo) has compiled in
    this process so far, from dynamo's own counter: a test reads recompilations off the log."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",)}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "count"
    CATEGORY = "testing"

    def count(self, samples):
        from torch._dynamo.utils import counters

        print(f"ferry-test: dynamo graphs {counters['stats']['unique_graphs']}", flush=True)
        return (samples,)


NODE_CLASS_MAPPINGS = {
    "FerryTestConditioning": FerryTestConditioning,
    "FerryTestLatent": FerryTestLatent,
    "FerryTestPlainClone": FerryTestPlainClone,
    "FerryTestHold": FerryTestHold,
    "FerryTestSaveConditioning": FerryTestSaveConditioning,
    "FerryTestSaveImage": FerryTestSaveImage,
    "FerryTestDynamoGraphs": FerryTestDynamoGraphs,
}


# -- tiny text encoders (make_text_encoders.py) ------------------------------------------------
# Core builds a text encoder from a fixed config and sizes it only through its own hook,
# model_options["<model_name>_model_config"], which CLIPLoader has no input for: a file written
# by make_text_encoders.py names its sizes in its metadata, handed to core's
# load_text_encoder_state_dicts here. That is where every loader meets (core's load_clip, the
# dynamic delegate's reload, Ferry's text-encoder loader, which gives it meta tensors): it sees
# state dicts, not paths, so a state dict is known by its keys and shapes. State dicts of other
# files load exactly as core loads them.
_real_load_te = comfy.sd.load_text_encoder_state_dicts
_te_signature = inspect.signature(_real_load_te)
_sized = {}  # path -> (mtime, signature, sizes)


#: Keys of core's quantized formats (a file in fp8_scaled, and the same after core's
#: convert_old_quants renamed them): left out, so a quantized file keeps its sizes.
_QUANT_KEYS = (".scale_weight", ".weight_scale", ".comfy_quant", "scaled_fp8", ".scale_input",
               ".input_scale")  # fmt: skip


def _signature(named_shapes):
    return frozenset(
        (k, tuple(int(n) for n in shape))
        for k, shape in named_shapes
        if not k.endswith(_QUANT_KEYS)
    )


def _sized_files():
    import folder_paths
    from safetensors import safe_open

    for name in folder_paths.get_filename_list("text_encoders"):
        path = folder_paths.get_full_path("text_encoders", name)
        if not path or not path.endswith(".safetensors"):
            continue
        mtime = os.path.getmtime(path)
        if _sized.get(path, (None,))[0] != mtime:
            with safe_open(path, framework="pt") as f:
                meta = (f.metadata() or {}).get("ferry_test_model_config")
                sig = (
                    _signature((k, f.get_slice(k).get_shape()) for k in list(f.keys()))
                    if meta
                    else None
                )
            _sized[path] = (mtime, sig, json.loads(meta) if meta else None)
        yield _sized[path][1:]


def _tiny_sizes(state_dicts):
    sigs = {_signature((k, v.shape) for k, v in sd.items()) for sd in state_dicts}
    sizes = {}
    for sig, found in _sized_files():
        if sig in sigs:
            sizes.update(found)
    return sizes


@functools.wraps(_real_load_te)
def _load_te(*args, **kwargs):
    call = _te_signature.bind(*args, **kwargs)
    given = call.arguments.get("model_options") or {}
    sizes = _tiny_sizes(call.arguments.get("state_dicts") or [])
    call.arguments["model_options"] = {**given, **sizes}
    return _real_load_te(*call.args, **call.kwargs)


comfy.sd.load_text_encoder_state_dicts = _load_te

# -- fault injection -------------------------------------------------------------------------
_lock = threading.Lock()
_armed = {}  # fault name -> its parameters
_fired = {"eio": 0, "fill": 0, "block": 0}


def _under(path, folder):
    return os.path.abspath(path).startswith(os.path.abspath(folder) + os.sep)


def _take(fault, match):
    """Whether the armed ``fault`` fires now (``match(params)``); counts it."""
    with _lock:
        p = _armed.get(fault)
        if p is None or not match(p):
            return None
        p["count"] -= 1
        if p["count"] <= 0:
            del _armed[fault]
        _fired[fault] += 1
        return p


_real_preadv = os.preadv


def _preadv(fd, buffers, offset, *rest):
    def on_folder(p):
        try:
            return _under(os.readlink(f"/proc/self/fd/{fd}"), p["folder"])
        except OSError:
            return False

    if _take("eio", on_folder) is not None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    return _real_preadv(fd, buffers, offset, *rest)


_real_replace = os.replace


def _replace(src, dst, *args, **kwargs):
    _real_replace(src, dst, *args, **kwargs)
    name = os.path.basename(str(dst))
    is_group = name.startswith("group-") and name.endswith(".safetensors")
    p = _take("fill", lambda p: is_group and _under(str(dst), p["folder"]))
    if p is not None:
        st = os.statvfs(p["folder"])
        fd = os.open(p["ballast"], os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize)
        finally:
            os.close(fd)


_real_block_forward = mmdit.JointBlock.forward
_block_calls = [0]


def _block_forward(self, *args, **kwargs):
    with _lock:
        _block_calls[0] += 1
        n = _block_calls[0]
    if _take("block", lambda p: n >= p["at"]) is not None:
        raise RuntimeError("ferry test: a block raised inside its forward")
    return _real_block_forward(self, *args, **kwargs)


os.preadv = _preadv
os.replace = _replace
mmdit.JointBlock.forward = _block_forward
routes = PromptServer.instance.routes


@routes.post("/ferry_test/arm")
async def _arm(request):
    body = await request.json()
    fault = body.pop("fault")
    body.setdefault("count", 1)
    with _lock:
        if fault == "block":
            body["at"] = _block_calls[0] + body.get("at", 1)
        _armed[fault] = body
    return web.json_response({"armed": fault})


@routes.post("/ferry_test/disarm")
async def _disarm(request):
    with _lock:
        _armed.clear()
    return web.json_response({})


@routes.get("/ferry_test/state")
async def _state(request):
    with _lock:
        return web.json_response({"fired": dict(_fired), "armed": sorted(_armed)})
