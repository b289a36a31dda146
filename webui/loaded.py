"""Whether Forge still holds a network: the checkpoint it has loaded now.

Forge keeps one checkpoint (``modules.sd_models.model_data.sd_model``). To switch, its
``forge_model_reload`` first drops the old one (``model_data.sd_model = None``), then unloads
every model (``unload_all_models``): a Ferry network unloaded while it belongs to no loaded
checkpoint is being thrown away, and its layout is discarded unread (offload_core/ending.py,
[Note: release by kind of ending]); any other unload gives the weights back.
"""

from __future__ import annotations

import sys
from typing import Any


def checkpoint_holds(network_owner: Any) -> bool:
    """True when Forge's loaded checkpoint holds ``network_owner`` (a UNet's KModel or a CLIP's
    text encoder), or when there is no Forge to ask (outside Forge: keep, restore)."""
    sd_models = sys.modules.get("modules.sd_models")  # imported by Forge long before any unload
    if sd_models is None:
        return True
    model = sd_models.model_data.sd_model
    objects = getattr(model, "forge_objects", None)
    if objects is None:  # None (a reload under way) or Forge's FakeInitialModel
        return False
    unet = getattr(objects, "unet", None)
    clip = getattr(objects, "clip", None)
    held = (getattr(unet, "model", None), getattr(clip, "cond_stage_model", None))
    return any(network_owner is h for h in held)
