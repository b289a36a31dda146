"""A host whose model runs through methods other than its forward marks each call as one pass
of Ferry's offload ([Note: a pass the host marks] in offload_core/runtime/engine.py)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from ..offload_core import find_offload


def mark_passes(module: nn.Module, methods: Iterable[str]) -> None:
    """Each call of ``module``'s ``methods`` is one pass while an offload of ``module`` is
    live; with none live it calls straight through. Installed once per module and method (an
    attribute of the instance, over the class's method: the host's object is shared by its
    clones, and the wrapper outlives any one layout).

    The wrapper holds ``module`` weakly: an attribute of the module that held it strongly (as
    its bound method does) would make a cycle, and a text encoder ComfyUI drops would wait
    for a full garbage collection (core then warns of a memory leak on each prompt)."""
    for name in methods:
        original = getattr(module, name, None)
        if original is None or getattr(original, "ferry_marks_passes", False):
            continue
        marked = _marked(weakref.ref(module), _unbound(module, original))
        marked.ferry_marks_passes = True  # type: ignore[attr-defined]
        object.__setattr__(module, name, marked)


def _unbound(module: nn.Module, original: Any) -> Callable[[nn.Module], Callable[..., Any]]:
    """How to get the method back from the module, holding no reference to the module: a
    method of the module itself is kept as its function; any other callable (a wrapper
    another pack installed) as it is."""
    func = getattr(original, "__func__", None)
    if func is not None and getattr(original, "__self__", None) is module:
        return lambda m: func.__get__(m)  # type: ignore[no-any-return]
    return lambda m: original  # type: ignore[no-any-return]


def _marked(
    ref: weakref.ref[nn.Module], method: Callable[[nn.Module], Callable[..., Any]]
) -> Callable[..., Any]:
    def marked(*args: Any, **kwargs: Any) -> Any:
        module = ref()
        if module is None:
            raise ReferenceError("the text encoder this method belonged to is gone")
        call = method(module)
        handle = find_offload(module)
        if handle is None or handle.removed:
            return call(*args, **kwargs)
        with handle.one_pass():
            return call(*args, **kwargs)

    return marked
