"""What Ferry asks of ComfyUI core, one function per contract, on every core it supports
(v0.3.64 .. v0.33.0): where a newer core moved or changed something, the adapter is here and
names the core function it follows. Nothing else in the pack tests for a core version.
"""

from __future__ import annotations

import importlib
import inspect
import weakref
from collections.abc import Callable
from typing import Any

import comfy.model_management as mm
import comfy.model_patcher
import comfy.sd
import comfy.utils
import psutil
import torch

from ...offload_core.model import meta_build
from ...offload_core.units import fmt_bytes
from .dynamic import give_lazy_layers_meta_weights, restore_model_dtypes, say_once

try:  # v0.11+: aimdo's switch and the RAM-pressure cache's headroom live here
    import comfy.memory_management as core_memory
except ImportError:
    core_memory = None  # type: ignore[assignment]


#: Where a BaseModel holds its network (the state-dict prefix of its tensors).
DM = "diffusion_model."


def string_to_seed(key: str) -> int:
    # Moved to comfy.utils; the old name in comfy.model_patcher warns on every call (v0.33).
    fn = getattr(comfy.utils, "string_to_seed", None) or comfy.model_patcher.string_to_seed
    return int(fn(key))


def lora_compute_dtype(device: torch.device) -> torch.dtype:
    """The dtype ``ModelPatcher.patch_weight_to_device`` computes a LoRA in on ``device``:
    ``comfy.model_management.lora_compute_dtype`` (float16 on most NVIDIA cards) since v0.4,
    float32 before it."""
    fn = getattr(mm, "lora_compute_dtype", None)
    return fn(device) if callable(fn) else torch.float32


def patched_weight(patcher: Any, key: str, device_to: torch.device) -> Any:
    """The weight of ``key`` with its patches, as ``ModelPatcher.patch_weight_to_device``
    computes it, returned rather than kept: ``return_weight=True`` where core has it (v0.33);
    before, core sets it on the model (and backs up the original): the result is read from
    the model and the backup it made dropped (the caller puts its own tensor back)."""
    fn = patcher.patch_weight_to_device
    if "return_weight" in inspect.signature(fn).parameters:
        return fn(key, device_to=device_to, return_weight=True)
    had_backup = key in patcher.backup
    fn(key, device_to=device_to)
    out = comfy.utils.get_attr(patcher.model, key)
    if not had_backup:
        patcher.backup.pop(key, None)
    return out


def set_inference_dtype(config: Any, dtype: Any, manual_cast: Any, device: torch.device) -> None:
    """As ``load_diffusion_model_state_dict`` sets it (v0.33 passes the load device: some model
    configs choose their cast from it)."""
    params = inspect.signature(config.set_inference_dtype).parameters
    takes_device = "device" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    if takes_device:
        config.set_inference_dtype(dtype, manual_cast, device=device)
    else:
        config.set_inference_dtype(dtype, manual_cast)


def build_on_meta(config: Any, sd: dict[str, torch.Tensor]) -> Any:
    """``config.get_model`` as ``load_diffusion_model_state_dict`` calls it (on the CPU), with
    the diffusion model's tensors that ``sd`` (the file, keys without their prefix) holds on
    the meta device (offload_core/model/meta_build.py), and every layer holding its (meta)
    weights: under dynamic VRAM core builds Linears without them (see dynamic.py)."""
    held = {DM + k for k in sd}
    base = meta_build.build_on_meta(lambda device: config.get_model(sd, "", device=device), held)
    give_lazy_layers_meta_weights(base.diffusion_model)
    return base


def load_diffusion_model(path: str, model_options: dict[str, Any] | None = None) -> Any:
    """``comfy.sd.load_diffusion_model`` with a plain (non-dynamic) patcher, the weights in the
    dtypes the model was built for: a MODEL that Ferry (or its quantizer) then owns. Under
    dynamic VRAM core would hand back a ModelPatcherDynamic whose non-dynamic delegate loads
    the file again, unquantized."""
    options = model_options or {}
    load = comfy.sd.load_diffusion_model
    if "disable_dynamic" in inspect.signature(load).parameters:
        patcher = load(path, model_options=options, disable_dynamic=True)
    else:
        patcher = load(path, model_options=options)
    restore_model_dtypes(patcher.model.diffusion_model)
    return patcher


def free_vram(patcher: Any) -> Callable[[torch.device], int | None]:
    """What core counts as free on a device, for vram_budget "auto": ``ModelPatcher.
    get_free_memory`` (v0.33: ``get_free_memory`` plus the VRAM aimdo could evict,
    ``comfy_aimdo.model_vbar.vbars_analyze``), else ``comfy.model_management.get_free_memory``.
    None on a CPU: there is no VRAM to budget (offload_core's own rule)."""

    ref = weakref.ref(patcher)  # kept on the BaseModel's live layout: must not keep the patcher

    def free(device: torch.device) -> int | None:
        device = torch.device(device)
        if device.type == "cpu":
            return None
        fn = getattr(ref(), "get_free_memory", None)
        return int(fn(device) if callable(fn) else mm.get_free_memory(device))

    return free


def count_pinned(delta: int) -> None:
    """Adds Ferry's pinned slabs to core's pinned-memory count (``TOTAL_PINNED_MEMORY``, which
    ``ensure_pin_registerable`` and, with --fast-disk, ``ensure_pin_budget`` hold against
    ``MAX_PINNED_MEMORY``), so core frees its own pins before both together pass its budget.
    Cores before v0.4 have no count. v0.8 resets it to 0 when its own last pin goes: the
    count is then clamped at 0 rather than going negative."""
    if hasattr(mm, "TOTAL_PINNED_MEMORY"):
        mm.TOTAL_PINNED_MEMORY = max(0, int(mm.TOTAL_PINNED_MEMORY) + int(delta))


def ram_cache_shortfall() -> tuple[int, int] | None:
    """(RAM available, core's headroom) when ComfyUI's RAM-pressure cache (the default in
    v0.33; ``comfy.memory_management.RAM_CACHE_HEADROOM``, set while a prompt runs) finds less
    RAM available than its headroom; None otherwise (older cores: no such cache by default).
    Then ``PromptExecutor.execute_async`` drops cached node outputs after every node (models
    included), so the next prompt loads the model and Ferry lays it out again."""
    headroom = int(getattr(core_memory, "RAM_CACHE_HEADROOM", 0) or 0)
    if headroom <= 0:
        return None
    available = int(psutil.virtual_memory().available)
    return (available, headroom) if available < headroom else None


def executing_node() -> str | None:
    """The node executing now, as "node 7 (ModelSamplingSD3)", or None outside a prompt.
    ``comfy_execution.utils.get_executing_context`` (every supported core) gives its id while
    the node runs; its class comes from the running prompt (``PromptQueue.currently_running``:
    items of (number, prompt_id, prompt, ...))."""
    try:
        from comfy_execution.utils import get_executing_context
    except ImportError:
        return None
    ctx = get_executing_context()
    if ctx is None:
        return None
    node_id = str(ctx.node_id)
    class_type = None
    try:
        import server

        running = server.PromptServer.instance.prompt_queue.currently_running
        for item in list(running.values()):
            if len(item) > 2 and item[1] == ctx.prompt_id:
                class_type = item[2].get(node_id.split(".")[0], {}).get("class_type")
    except (ImportError, AttributeError, TypeError):
        pass  # a core without a server (tests, scripts): the id alone
    return f"node {node_id} ({class_type})" if class_type else f"node {node_id}"


def say_if_ram_cache_drops_models() -> None:
    """Says once where ComfyUI's RAM-pressure cache will drop the model after each node."""
    short = ram_cache_shortfall()
    if short is not None:
        available, headroom = short
        say_once("ram-cache", RAM_CACHE_HELP.format(fmt_bytes(available), fmt_bytes(headroom)))


RAM_CACHE_HELP = (
    "Ferry Offload Model: ComfyUI's RAM-pressure cache (its default) keeps {1} of RAM free and "
    "{0} is available now, so after each node it drops cached models, this one included: the "
    "next prompt loads the model and Ferry lays it out again. To keep it, use Ferry's disk tier "
    "(the least RAM), or start ComfyUI with --cache-ram followed by a headroom in GiB below "
    "what is free (e.g. --cache-ram 1), or with --cache-classic."
)


def clip_loader_choices(loader: str) -> tuple[list[str], list[str] | None]:
    """(the ``type`` choices, the ``device`` choices or None) of core's CLIP loader node
    ``loader`` (CLIPLoader, DualCLIPLoader): each core version offers its own list. Read from
    core's own top-level ``nodes`` module (not this pack's folder of the same name)."""
    core_nodes = importlib.import_module("nodes")
    inputs = getattr(core_nodes, loader).INPUT_TYPES()
    types = list(inputs["required"]["type"][0])
    device = inputs.get("optional", {}).get("device")
    return types, (list(device[0]) if device else None)


def clip_type(name: str) -> Any:
    """As CLIPLoader maps its ``type`` widget (an unknown name: STABLE_DIFFUSION)."""
    return getattr(comfy.sd.CLIPType, name.upper(), comfy.sd.CLIPType.STABLE_DIFFUSION)


def clip_model_options(device: str) -> dict[str, Any]:
    """As CLIPLoader maps its ``device`` widget."""
    if device == "cpu":
        return {"load_device": torch.device("cpu"), "offload_device": torch.device("cpu")}
    return {}
