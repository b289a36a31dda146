"""A host whose model runs through methods other than its forward marks each call as one pass
of Ferry's offload ([Note: a pass the host marks] in offload_core/runtime/engine.py)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from ..offload_core import find_offload


def mark_passes(module: nn.Module, methods: Iterable[str], *, on: object | None = None) -> None:
    """Each call of ``on``'s ``methods`` (by default ``module``'s) is one pass while an offload
    of ``module`` is live; with none live it calls straight through. ``on`` is the object the
    host calls where that is not the network (Forge's text-processing engines hold its text
    encoder). Installed once per object and method (an attribute of the instance, over the
    class's method: the host's object is shared by its clones, and the wrapper outlives any
    one layout).

    The wrapper holds ``module`` and ``on`` weakly: an attribute of an object that held it
    strongly (as its bound method does) would make a cycle, and a text encoder the host drops
    would wait for a full garbage collection (ComfyUI then warns of a memory leak on each
    prompt)."""
    target = module if on is None else on
    for name in methods:
        original = getattr(target, name, None)
        if original is None or getattr(original, "ferry_marks_passes", False):
            continue
        marked = _marked(weakref.ref(module), weakref.ref(target), _unbound(target, original))
        marked.ferry_marks_passes = True  # type: ignore[attr-defined]
        object.__setattr__(target, name, marked)


def _unbound(target: object, original: Any) -> Callable[[object], Callable[..., Any]]:
    """How to get the method back from its object, holding no reference to the object: a
    method of the object itself is kept as its function; any other callable (a wrapper
    another pack installed) as it is."""
    func = getattr(original, "__func__", None)
    if func is not None and getattr(original, "__self__", None) is target:
        return lambda obj: func.__get__(obj)  # type: ignore[no-any-return]
    return lambda obj: original  # type: ignore[no-any-return]


def _marked(
    module_ref: weakref.ref[nn.Module],
    target_ref: weakref.ref[Any],
    method: Callable[[object], Callable[..., Any]],
) -> Callable[..., Any]:
    def marked(*args: Any, **kwargs: Any) -> Any:
        module, target = module_ref(), target_ref()
        if module is None or target is None:
            raise ReferenceError("the text encoder this method belonged to is gone")
        call = method(target)
        handle = find_offload(module)
        if handle is None or handle.removed:
            return call(*args, **kwargs)
        with handle.one_pass():
            return call(*args, **kwargs)

    return marked
