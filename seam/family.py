"""Whether a patcher being collected was the last of its family: then nothing can use its
network again, and Ferry discards the layout instead of reading it back.

[Note: the last of a family]
A host's patchers form a tree: every clone holds the patcher it was cloned from (``parent``:
ComfyUI's ModelPatcher.clone; Ferry's patchers hold their anchor, which holds the input's
parent, nodes/patcher/hold.py), and every object that can load a network reaches it through one of
them (a node's cached output, a CLIP holding its patcher, a LoRA's clone). So when a patcher is
collected, the network can still be used only if one of its ancestors outlives it: an ancestor
is referred to by something other than its own child in the chain (the cache, a sibling clone,
a CLIP object). When none is, the whole family goes with this patcher: its layout is
discarded (offload_core/ending.py), not restored. Objects that are garbage themselves (a
reference cycle being collected) are not found by ``gc.get_referrers`` while the collector
runs finalizers, so they do not count as holders. A weak reference (ComfyUI's LoadedModel
holds its patcher weakly) is not a holder either.
"""

from __future__ import annotations

import gc
import types
from typing import Any


def last_of_family(patcher: Any) -> bool:
    """True when no ancestor of ``patcher`` (which is being collected) is held by anything
    but its child in the chain: nothing left can load the network (see the Note above)."""
    child, ancestor = patcher, getattr(patcher, "parent", None)
    while ancestor is not None:
        own = (child, getattr(child, "__dict__", None))
        for r in gc.get_referrers(ancestor):
            if isinstance(r, types.FrameType) or any(r is o for o in own):
                continue
            return False
        child, ancestor = ancestor, getattr(ancestor, "parent", None)
    return True
