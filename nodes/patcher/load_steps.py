"""The steps of a Ferry patcher's load in ComfyUI (patcher.py's verbs call them in order):
refuse what cannot load, start from the plain host copy with the patcher's weight patches
baked in as core computes them, lay the network out, and record what core's own load would.
Functions of the patcher, so the mixin keeps only the verbs core calls."""

from __future__ import annotations

import logging
from typing import Any

import comfy.model_patcher
import comfy.utils
import torch

from ...offload_core import ApiUseError, ConfigError, Ending
from ...offload_core.model.layout import module_nbytes
from ...offload_core.sources.checkpoint_stream import CheckpointWeights
from ...seam.family import last_of_family
from ...seam.passes import mark_passes
from ..input_error import as_node_error
from ..loading.stream_loader import is_lazy, materialize, stream_weights, unstreamed_patches
from . import block_compile, comfy_core
from .bake_lora import bake_lora
from .recovery import for_node, refuse_lost

log = logging.getLogger("ferry")


def refuse_compile(p: Any) -> None:
    """Checked on every load, before any weight moves (a laid-out model skips load())."""
    refuse_lost(p.model)
    block_compile.check(p, p.ferry_offload)


def materialize_plain(p: Any) -> None:
    """A plain load of the Ferry loader's model: read it whole first, as UNETLoader does."""
    if p.ferry_offload is None and is_lazy(p.model):
        materialize(p.model, p.offload_device)


def prepare(p: Any, device_to: torch.device) -> CheckpointWeights | None:
    """The plain network with ``p``'s weight patches baked in; where its weights wait in a
    file (the Ferry loader's), that file's weights (groups are filled from it)."""
    # Start from the plain host copy: a plain clone may have left the module on the device,
    # or with lowvram weight functions that would apply its patches a second time.
    # Newer cores (>= 0.15) pin offloaded host weights in place while partially loading;
    # Ferry moves those weights into its own slabs, so they must be unregistered first.
    unpin = getattr(p, "unpin_all_weights", None)
    if callable(unpin):
        unpin()
    if getattr(p.model, "model_lowvram", False):
        for m in p.model.modules():
            comfy.model_patcher.wipe_lowvram_weight(m)
        p.model.model_lowvram = False
    net = p.ferry_site.network_of(p.model)
    mark_passes(net, p.ferry_site.passes)  # where the host calls methods, not the forward
    weights = stream_weights(p, device_to)
    if weights is not None:
        # The Ferry loader's model: groups come straight from its file, their patches
        # computed as they are read. A text encoder's other files (a CLIP-L beside the
        # streamed T5) were read whole into the module: their patches are baked in as
        # for any model, with ComfyUI's backups (an unpatch puts the originals back).
        patch_weights(p, device_to, unstreamed_patches(p, weights))
        return weights
    net.to(p.offload_device)
    patch_weights(p, device_to, list(p.patches))
    if p.ferry_offload is not None:  # GGUF's per-forward patches, computed once
        bake_lora(p, device_to, p.ferry_offload.policy)
    return None


def patch_weights(p: Any, device_to: torch.device | None, keys: list[str]) -> None:
    """Bakes ``p``'s weight patches (LoRA, ...) of ``keys`` into the host weights, exactly
    as ComfyUI's full load computes them, so Ferry lays out the patched weights."""
    for key in keys:
        bk = p.backup.get(key)
        if bk is not None:  # already patched by an earlier layout: start from the original
            comfy.utils.set_attr_param(p.model, key, bk.weight)
        p.patch_weight_to_device(key, device_to=device_to)
        w = comfy.utils.get_attr(p.model, key)
        if w.device != p.offload_device:
            comfy.utils.set_attr_param(p.model, key, w.to(p.offload_device))


def lay_out(p: Any, device: torch.device) -> int:
    """Makes ``p``'s network laid out on ``device`` (or keeps the live layout) and moves what
    lies outside it there; returns the bytes Ferry and those parts hold on the device."""
    cfg = p.ferry_offload
    layout = p._ferry_layout()
    pbar = comfy.utils.ProgressBar(1)

    def progress(done: int, total: int) -> None:
        pbar.update_absolute(done, total)

    weights = p.patches_uuid if p.patches else None
    try:
        changed = layout.ensure(cfg, device, weights, lambda: prepare(p, device), progress)
    except ConfigError as e:
        raise as_node_error(e) from None
    except ApiUseError as e:  # unreachable by design (seam/live_layout.py); in ComfyUI's words
        raise for_node(e) from None
    outside = 0
    for m in p.ferry_site.outside(p.model):
        m.to(device)
        outside += module_nbytes(m)
    if changed:
        log.info("ferry: laid out %s\n%s", cfg.title, layout.handle.plan.describe())
        comfy_core.say_if_ram_cache_drops_models()
    return layout.device_bytes() + outside


def account(p: Any, device: torch.device, device_bytes: int) -> None:
    """What ComfyUI's own load would record: the model is on ``device``, fully loaded,
    holding ``device_bytes`` there."""
    p.model.device = device
    p.model.model_lowvram = False
    p.model.lowvram_patch_counter = 0
    p.model.model_loaded_weight_memory = device_bytes
    if hasattr(p.model, "model_offload_buffer_memory"):
        # Newer cores count their own offload buffers here; Ferry's load uses none.
        p.model.model_offload_buffer_memory = 0
    p.model.current_weight_patches_uuid = p.patches_uuid


def ending(p: Any, unpatch_all: bool) -> Ending:
    """DISCARD where ``p`` is being collected and was the last of its family, so nothing can
    load the network again ([Note: the last of a family], seam/family.py): Ferry's copies
    are dropped unread. Any other release gives the weights back (an unload keeps the model
    in ComfyUI's cache; a plain clone may load it next)."""
    if p._ferry_collected and not unpatch_all and last_of_family(p):
        return Ending.DISCARD
    return Ending.RESTORE
