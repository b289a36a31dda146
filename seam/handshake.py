"""The loader's handshake with a live layout: which patcher is loading next, and which one owns
the layout, so an unload between two loads of the same offload keeps it. Any host.

[Note: why a "loading" mark]
A host's loader unloads every loaded clone of a model just before it loads the one asked for
(ComfyUI's ``load_models_gpu`` detaches them, Forge's ``unload_model_clones`` unpatches them
without moving them), and it asks the *loading* patcher ``is_clone(old)`` first. Laying the
groups out again on every prompt would cost a full copy (a full rewrite on the disk tier), so
an unload immediately followed by a Ferry patcher with the same offload keeps the layout: a
Ferry patcher marks itself in ``is_clone`` (``mark_loading``); a plain patcher (Ferry off)
leaves no mark, so the unload before it releases the layout and the host's own load gets the
plain network back. A host also unloads clones it finds abandoned (a garbage-collected
patcher detaches itself): only the patcher that loaded the layout (its *owner*), or any once
the owner is gone, releases it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any

from .offload import HeldOffload

#: The live layout's offload as the handshake compares it: (policy, name), None if none.
LiveOffload = Callable[[], "Hashable | None"]


class Handshake:
    """One live layout's side of the handshake (``LiveLayout.handshake``). ``live`` answers
    what the layout serves now ((policy, name), None where nothing is live): a function, so
    the handshake holds no reference to its layout."""

    def __init__(self, live: LiveOffload) -> None:
        self.loading: HeldOffload | None = None
        self._live = live
        self._owner: weakref.ref[Any] | None = None

    def mark_loading(self, offload: HeldOffload | None) -> None:
        self.loading = offload

    def set_owner(self, patcher: Any) -> None:
        """``patcher`` is the one loading (so using) the layout now."""
        self._owner = weakref.ref(patcher) if patcher is not None else None

    def owner(self) -> Any:
        """The patcher that loaded the layout (None: none, or it is gone)."""
        return self._owner() if self._owner is not None else None

    def keep_on_detach(self) -> bool:
        """True when the patcher about to load wants exactly the live layout (the mark is
        consumed: a later unload with no mark releases)."""
        loading, self.loading = self.loading, None
        live = self._live()
        return live is not None and loading is not None and live == (loading.policy, loading.name)

    def should_release_on_detach(self, patcher: Any) -> bool:
        """Whether an unload of ``patcher`` that does not move the model (a clone replacing
        it, or the patcher being garbage-collected) releases the layout: not when a Ferry
        patcher with the same offload loads next, and only from the owner (or any patcher
        once the owner is gone)."""
        if self.keep_on_detach():
            return False
        owner = self.owner()
        return owner is None or owner is patcher
