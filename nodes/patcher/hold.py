"""How Ferry's hold on a ComfyUI MODEL lasts through the clones ComfyUI makes, and says when
it is lost: the callbacks every clone carries, and the anchor a collected clone leaves the
layout to. ComfyUI's host only (patcher.py puts both on each Ferry patcher)."""

from __future__ import annotations

from typing import Any

from comfy.patcher_extension import CallbacksMP

from . import comfy_core
from .dynamic import say_once


class HeldByFerry:
    """What every Ferry patcher is (patcher.py's mixin derives from it)."""


# [Note: a hold that says when it is lost]
# Ferry holds a MODEL through its patcher's class, which Ferry's own clone keeps (a pack's
# clone that sets its class back runs inside it). A node could still build a patcher Ferry's
# clone never sees (copying the fields into a new object, or setting ``__class__`` after
# cloning). What every core carries across any clone is the patcher's callbacks, wrappers and
# attachments, whatever its class: so a Ferry patcher carries two callbacks. ON_CLONE notes on
# each clone which node made it (the executing node then); ON_PRE_RUN, called on the patcher
# that samples, finds a patcher that carries Ferry's callbacks without Ferry's class: Ferry
# was dropped there, and the log says so once, naming the node that made that patcher. The
# output is still right (the plain model runs); only the memory Ferry would have saved is not.
HOLD_KEY = "ferry.hold"
MADE_BY = "ferry_made_by"  # on a clone's __dict__ (survives a change of __class__)


def _note_clone(src: Any, n: Any) -> None:
    n.__dict__[MADE_BY] = comfy_core.executing_node() or src.__dict__.get(MADE_BY)


def _check_held(patcher: Any) -> None:
    if isinstance(patcher, HeldByFerry):
        return
    node = patcher.__dict__.get(MADE_BY) or "a node after Ferry Offload Model"
    say_once(
        f"dropped:{node}",
        DROPPED_HELP.format(node=node, cls=type(patcher).__name__),
    )


DROPPED_HELP = (
    "Ferry Offload Model: {node} replaced the model's patcher with a {cls} that is not "
    "Ferry's, so this model now runs WITHOUT Ferry's offload (the output is the same; the "
    "memory is not saved). Put Ferry Offload Model after {node}, right before the sampler."
)


def hold(n: Any) -> None:
    """Ferry's callbacks on a Ferry patcher (see the Note above), once."""
    if _check_held in n.get_callbacks(CallbacksMP.ON_PRE_RUN, HOLD_KEY):
        return
    n.add_callback_with_key(CallbacksMP.ON_CLONE, HOLD_KEY, _note_clone)
    n.add_callback_with_key(CallbacksMP.ON_PRE_RUN, HOLD_KEY, _check_held)


# [Note: the anchor]
# ComfyUI caches a node's output and drops it when the node runs again; a dropped patcher is
# garbage-collected, and its __del__ detaches it. ComfyUI's LoadedModel then switches to the
# patcher's ``parent`` (LoadedModel._switch_parent), and every later load of the same model
# detaches that parent (load_models_gpu's is_clone loop). A Ferry node that runs again with the
# same config (its panel settings saved anew, an input upstream changed and changed back) makes
# its new patcher before the old one is collected: releasing the layout on that collection
# would lay the model out again for nothing. So each Ferry patcher's parent is a config-less
# Ferry patcher of the same model, the *anchor*, kept on the input MODEL (cached upstream, so
# it outlives the Ferry outputs): a collected Ferry patcher leaves the layout to the anchor,
# whose detach (the next load of anything else), unload or own collection releases it exactly
# as the owner's would have, and which a Ferry patcher with the same config keeps. The anchor's
# parent is the input's parent, so LoadedModel's chain ends where it ended without Ferry.
ANCHOR = "ferry_anchor"


def anchor(model: Any, src: Any, ferry_class: type, site: Any) -> Any:
    """The anchor of the patcher ``model`` (see the Note above), made from ``src`` (its plain
    patcher) with the class ``ferry_class`` and the network's ``site`` the first time."""
    a = model.__dict__.get(ANCHOR)
    if a is None or a.model is not src.model:
        a = src.clone()
        a.__class__ = ferry_class
        a.ferry_offload, a.ferry_site = None, site
        # LoadedModel's chain goes on to where the input's own would (no reference cycle: the
        # input holds the anchor, the anchor holds only the input's ancestors).
        a.parent = getattr(model, "parent", None)
        model.__dict__[ANCHOR] = a
    return a
