"""ComfyUI >= 0.15 "dynamic VRAM" (comfy-aimdo): get a plain ModelPatcher Ferry can drive.

A dynamic patcher's weights are streamed by aimdo itself; two offloaders on one model would
fight. Core can hand out a non-dynamic delegate of the same model (``clone(disable_dynamic=True)``
re-runs its loader); where it cannot, the user is told what to switch. Duck-typed (no ComfyUI
import) so CI tests it with stand-ins.
"""

from __future__ import annotations

from typing import Any

from .config import NodeInputError

DYNAMIC_VRAM_HELP = (
    "this ComfyUI loads the model with dynamic VRAM (comfy-aimdo), which streams its weights "
    "itself, and could not hand Ferry a non-dynamic copy. Start ComfyUI with "
    "--disable-dynamic-vram to use Ferry's offload, or bypass this node to use ComfyUI's own"
)


def is_dynamic(model: Any) -> bool:
    fn = getattr(model, "is_dynamic", None)
    return bool(fn()) if callable(fn) else False


def plain_patcher(model: Any) -> Any:
    """``model`` itself, or a non-dynamic delegate of it; NodeInputError('model') otherwise."""
    if not is_dynamic(model):
        return model
    try:
        src = model.clone(disable_dynamic=True)
    except (TypeError, RuntimeError) as e:  # an older signature, or no loader to re-run
        raise NodeInputError("model", f"{DYNAMIC_VRAM_HELP} ({e})") from None
    if is_dynamic(src):
        raise NodeInputError("model", DYNAMIC_VRAM_HELP)
    return src
