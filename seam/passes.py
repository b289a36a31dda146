"""A host whose model runs through methods other than its forward marks each call as one pass
of Ferry's offload ([Note: a pass the host marks] in offload_core/runtime/engine.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from ..offload_core import find_offload


def mark_passes(module: nn.Module, methods: Iterable[str], *, on: object | None = None) -> None:
    """Each call of ``on``'s ``methods`` (by default ``module``'s) is one pass while an offload
    of ``module`` is live; with none live it calls straight through. ``on`` is the object the
    host calls where that is not the network (Forge's text-processing engines hold its text
    encoder). Installed once per object and method (an attribute of the instance, over the
    class's method: the host's object is shared by its clones, and the wrapper outlives any
    one layout)."""
    target = module if on is None else on
    for name in methods:
        original = getattr(target, name, None)
        if original is None or getattr(original, "ferry_marks_passes", False):
            continue

        def marked(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            handle = find_offload(module)
            if handle is None or handle.removed:
                return _original(*args, **kwargs)
            with handle.one_pass():
                return _original(*args, **kwargs)

        marked.ferry_marks_passes = True  # type: ignore[attr-defined]
        object.__setattr__(target, name, marked)
