"""A test-only ComfyUI node pack (copied into the test's custom_nodes folder, never shipped): a
CPU STAND-IN for what ComfyUI >= 0.15 turns on by default on an NVIDIA card, switched on by the
server's environment, FERRY_STANDIN=<comma list>; with none set it does nothing.

- ``aimdo``: what comfy-aimdo's initialisation turns on in ComfyUI v0.33.0 (main.py, after
  ``comfy_aimdo.control.init_devices`` succeeds, which it never does on a CPU):
  ``comfy.memory_management.aimdo_enabled = True`` (core's Linears are then built without
  weights and loaded lazily, in the file's dtype: comfy/ops.py) and ``comfy.model_patcher.
  CoreModelPatcher`` set to a dynamic patcher, so ``comfy.sd.load_diffusion_model`` hands out a
  dynamic MODEL whose ``clone(disable_dynamic=True)`` re-runs the loader and whose
  ``get_non_dynamic_delegate`` is core's own (``ModelPatcherDynamic.get_non_dynamic_delegate``,
  the function itself, not a copy). Core's own path needs what it asks of aimdo:
  ``comfy_aimdo.model_mmap.ModelMMAP`` (``comfy.utils.load_safetensors`` maps the file through
  it) is stood in for by a private mapping of the file with Python's mmap, and
  ``comfy_aimdo.host_buffer.HostBuffer`` (built per dynamic model after every node) by an
  empty one.
- ``lora-fp16``: ``comfy.model_management.lora_compute_dtype`` answers float16 for the CPU, as
  it does for most NVIDIA cards (``should_use_fp16``), through core's own cache of it.

What the stand-in CANNOT show: aimdo's VRAM paging (VBAR faults, eviction, the free VRAM that
``vbars_analyze`` adds), its pinned host buffers and asynchronous file reads, ``--fast-disk``,
and the dynamic patcher's own casts at use (dtype and LoRA at cast time): the stand-in patcher
loads like a plain one, so a latent made through it is the plain path's latent.

It also counts, for the tests, each ``comfy.sd.load_diffusion_model`` call (GET
/ferry_test/loads), and adds a loader whose dynamic MODEL core cannot load again (a custom
loader without ``cached_patcher_init``).
"""

import ctypes
import mmap
import os

import comfy.model_management
import comfy.model_patcher
import comfy.sd
import folder_paths
import torch
from aiohttp import web
from server import PromptServer

SWITCHES = {s for s in os.environ.get("FERRY_STANDIN", "").split(",") if s}
_loads = {"dynamic": 0, "plain": 0}


class StandInModelMMAP:
    """comfy_aimdo.model_mmap.ModelMMAP's interface: a private (copy-on-write) map of the file,
    its address, the open file's descriptor, and ``bounce`` (aimdo drops written pages)."""

    def __init__(self, path):
        self._file = open(path, "rb")  # noqa: SIM115 (lives as long as the tensors on it)
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY)
        self._buf = (ctypes.c_uint8 * len(self._map)).from_buffer(self._map)

    def get(self):
        return ctypes.addressof(self._buf)

    def get_file_handle(self):
        return self._file.fileno()

    def bounce(self):
        return True


class StandInHostBuffer:
    """comfy_aimdo.host_buffer.HostBuffer as core builds one for each dynamic model after every
    node (``comfy.model_management.reset_cast_buffers``): it holds no memory (aimdo's pinned
    host buffers are what this stand-in cannot show); nothing here reads through it."""

    def __init__(self, size, prewarm=0, max_grow_size=0, mark_cold=True):
        self.size = 0


class StandInDynamicPatcher(comfy.model_patcher.ModelPatcher):
    """ModelPatcherDynamic as far as a CPU runs it: dynamic (core routes it through its dynamic
    branches: clone, free_memory, the RAM cache), with the per-device pin state core reads, and
    core's own cached delegate; it loads like a plain patcher (no aimdo VBAR on a CPU)."""

    def __init__(self, model, load_device, offload_device, size=0, weight_inplace_update=False):
        super().__init__(model, load_device, offload_device, size, weight_inplace_update)
        self.non_dynamic_delegate_model = None
        pins = getattr(self.model, "dynamic_pins", None) or {}
        pins.setdefault(load_device, {"active": False, "current_prompt": False, "failed": False})
        self.model.dynamic_pins = pins

    def is_dynamic(self):
        return True

    def set_in_use_by_current_prompt(self, in_use):
        self.model.dynamic_pins[self.load_device]["current_prompt"] = in_use

    def partially_unload_ram(self, ram_to_unload, subsets=None):
        return 0  # no pinned host buffers to give back

    def unregister_inactive_pins(self, ram_to_unload, subsets=None):
        return 0

    get_non_dynamic_delegate = getattr(
        comfy.model_patcher, "ModelPatcherDynamic", object
    ).__dict__.get("get_non_dynamic_delegate")


_real_load = comfy.sd.load_diffusion_model


def _counted_load(unet_path, model_options={}, disable_dynamic=False):  # noqa: B006 (core's signature)
    _loads["plain" if disable_dynamic else "dynamic"] += 1
    return _real_load(unet_path, model_options=model_options, disable_dynamic=disable_dynamic)


class FerryTestLoaderWithoutReload:
    """UNETLoader, but like a custom loader that gives core no way to load it again."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"unet_name": (folder_paths.get_filename_list("diffusion_models"),)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, unet_name):
        model = comfy.sd.load_diffusion_model(
            folder_paths.get_full_path_or_raise("diffusion_models", unet_name)
        )
        model.cached_patcher_init = None
        return (model,)


NODE_CLASS_MAPPINGS = {}
if "aimdo" in SWITCHES and hasattr(comfy.model_patcher, "ModelPatcherDynamic"):
    import comfy.memory_management
    import comfy_aimdo.host_buffer
    import comfy_aimdo.model_mmap

    comfy_aimdo.model_mmap.ModelMMAP = StandInModelMMAP
    comfy_aimdo.host_buffer.HostBuffer = StandInHostBuffer
    comfy.model_patcher.CoreModelPatcher = StandInDynamicPatcher
    comfy.memory_management.aimdo_enabled = True
    comfy.sd.load_diffusion_model = _counted_load
    NODE_CLASS_MAPPINGS["FerryTestLoaderWithoutReload"] = FerryTestLoaderWithoutReload
if "lora-fp16" in SWITCHES:
    comfy.model_management.LORA_COMPUTE_DTYPES[torch.device("cpu")] = torch.float16
if SWITCHES:
    print(f"ferry stand-in: {sorted(SWITCHES)} on (a CPU stand-in for NVIDIA defaults)")


@PromptServer.instance.routes.get("/ferry_test/loads")
async def _loads_route(request):
    try:
        import comfy.memory_management as cm
    except ImportError:  # before v0.11
        cm = None
    return web.json_response(
        {
            **_loads,
            "switches": sorted(SWITCHES),
            "aimdo_enabled": bool(getattr(cm, "aimdo_enabled", False)),
            "core_patcher": getattr(
                comfy.model_patcher, "CoreModelPatcher", comfy.model_patcher.ModelPatcher
            ).__name__,
            "total_pinned": int(getattr(comfy.model_management, "TOTAL_PINNED_MEMORY", 0)),
        }
    )
