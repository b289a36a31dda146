"""When a fault meets a Ferry layout inside ComfyUI: recover by the next prompt, in its words.

offload_core rewrites a damaged group file itself where the model has a source of truth (the
Ferry loader's checkpoint). Where it has none (UNETLoader's model lived only in RAM before
Ferry laid it out), the damaged file held the only copy of those weights. Then Ferry drops the
layout (those tensors go to the meta device, never used) and asks ComfyUI to load the model
again before the next prompt, the way the "Unload models" / "Free model and node cache"
buttons do (``POST /free``): the prompt queue's ``free_memory`` flag, which ComfyUI's prompt
worker reads after the current prompt ends: it unloads every model and resets the executor's
cache, so the loader node runs again and the next prompt gets the model from its file, with or
without the Ferry node in the graph. It says so once, in the log and in the node error.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch

from ...offload_core import (
    AlreadyOffloadedError,
    ApiUseError,
    CorruptGroupFileError,
    FerryError,
    InferenceOnlyError,
)

ATTR = (
    "_ferry_comfy_layout"  # live_layout.py's attribute on the shared BaseModel (imports this file)
)

log = logging.getLogger("ferry")
KEY = "ferry.recovery"  # the APPLY_MODEL wrapper's key on a Ferry patcher
LOST = "ferry_lost"  # on a BaseModel whose weights went with a damaged file: its error


class ModelReloadError(FerryError):
    """What the sampling node shows: what happened and what ComfyUI does next."""


def _queue() -> Any:
    try:
        import server  # ComfyUI's; the pack also loads outside ComfyUI (CI)
    except ImportError:
        return None
    return getattr(getattr(server.PromptServer, "instance", None), "prompt_queue", None)


def request_reload() -> bool:
    """ComfyUI's own "free models and node cache" for after this prompt; False outside it."""
    queue = _queue()
    if queue is None:
        return False
    queue.set_flag("free_memory", True)
    return True


def in_prompt() -> bool:
    """Whether a prompt is executing (an error then becomes its node error). Outside one
    (the prompt worker unloading models, POST /free) an error would end ComfyUI's worker."""
    return bool(getattr(_queue(), "currently_running", None))


def has_meta(base: Any) -> bool:
    """The diffusion model has tensors with no data: lost with a damaged file, or waiting in
    the Ferry loader's checkpoint. Such a model must not be moved whole (``.to`` refuses)."""
    dm = getattr(base, "diffusion_model", None)
    return dm is not None and has_meta_module(dm)


def damaged_file(err: BaseException) -> tuple[str, str]:
    """The file and the folder the error names (the first path in its message)."""
    m = re.search(r"(/[^\s:()]+\.safetensors)", str(err))
    if m is None:
        return "a group file", "Ferry's disk folder"
    p = Path(m.group(1))
    return p.name, str(p.parent)


def drop_and_reload(layout: Any, err: BaseException) -> ModelReloadError:
    """Drops the layout whose file lost its weights and makes ComfyUI load the model again.
    ``layout`` (a ComfyLayout, or None once it let go) is released first."""
    if layout is not None:
        try:
            layout.release()
        except ModelReloadError as e:
            return e  # release found the loss itself and said so
    name, folder = damaged_file(err)
    then = (
        "ComfyUI loads the model again from its file before the next prompt (no restart)"
        if request_reload()
        else "load the model again"
    )
    msg = (
        f"Ferry Offload Model: the group file {name} in the disk folder {folder} was damaged "
        f"after it was written (truncated, changed or replaced; its bytes were not used), and "
        f"it held the only copy of those weights. Ferry dropped its layout: {then}."
    )
    log.warning("ferry: %s", msg)
    return ModelReloadError(msg)


def guard(executor: Any, *args: Any, **kwargs: Any) -> Any:
    """ComfyUI's APPLY_MODEL wrapper on a Ferry patcher: a damaged file Ferry could not
    rewrite becomes a reload of the model, not a model stranded until a restart."""
    try:
        return executor(*args, **kwargs)
    except CorruptGroupFileError as e:
        raise drop_and_reload(_live_layout(executor), e) from e
    except OSError as e:  # a read failed (EIO, a vanished network disk): nothing was used
        raise ModelReloadError(read_failed(_live_layout(executor), e)) from e
    except ApiUseError as e:
        raise for_node(e) from e


def for_node(err: ApiUseError) -> FerryError:
    """An offload_core error about the Python API's use (its message may name a Python
    call; see offload_core/errors.py), in ComfyUI's words."""
    if isinstance(err, InferenceOnlyError):
        return FerryError(
            "Ferry Offload Model streams weights for inference only, and a node after it ran "
            "the model with gradients on (training): bypass the Ferry Offload Model node for "
            "that graph"
        )
    then = (
        "ComfyUI loads the model again from its file before the next prompt (no restart)"
        if request_reload()
        else "load the model again"
    )
    what = (
        "the model still had a Ferry layout Ferry Offload Model did not make"
        if isinstance(err, AlreadyOffloadedError)
        else "the model's Ferry layout was removed while the prompt used it"
    )
    return ModelReloadError(f"Ferry Offload Model: {what}; {then}.")


def _live_layout(executor: Any) -> Any:
    base = getattr(executor, "class_obj", None)
    return base.__dict__.get(ATTR) if base is not None else None


def read_failed(layout: Any, err: OSError) -> str:
    """A read that failed leaves the layout as it was: the next prompt reads again."""
    handle = getattr(layout, "handle", None)
    folder = handle.stats().disk_folder if handle is not None else None
    where = f"the disk folder {folder}" if folder else "Ferry's disk folder"
    return (
        f"Ferry Offload Model: reading a group file in {where} failed "
        f"({err.strerror or err}); no weights were used from it and the layout is kept: the "
        "next prompt reads it again (check the disk if this repeats)"
    )


def refuse_lost(base: Any) -> None:
    """A Ferry load of a model whose weights were lost (found where no error can surface:
    a clone garbage-collected mid-prompt) says what happened instead of moving meta tensors.
    ComfyUI's reload, already requested, replaces the model before the next prompt."""
    err = base.__dict__.get(LOST)
    if err is not None:
        raise err


def quarantine(module: Any, err: ModelReloadError) -> None:
    """A module whose weights were lost until ComfyUI's reload replaces it: its lost (meta)
    tensors become zeros, so ComfyUI can still move and unload it (``.to`` of a meta tensor
    raises, and in ComfyUI's prompt worker that would stop every later prompt), and any
    forward of it raises ``err`` (the zeros are never computed on): a plain clone too, the
    Ferry node bypassed."""
    for m in module.modules():
        for k, p in m._parameters.items():
            if p is not None and p.device.type == "meta":
                zeros = torch.zeros(p.shape, dtype=p.dtype)
                m._parameters[k] = torch.nn.Parameter(zeros, requires_grad=False)
        for k, b in m._buffers.items():
            if b is not None and b.device.type == "meta":
                m._buffers[k] = torch.zeros(b.shape, dtype=b.dtype)

    def refuse(mod: Any, args: Any) -> None:
        raise err

    module.register_forward_pre_hook(refuse)


def has_meta_module(module: Any) -> bool:
    return any(t.device.type == "meta" for t in [*module.parameters(), *module.buffers()])
