"""The patcher class a host's model has while Ferry holds it, kept through any clone.

Both hosts hold a model through a subclass of the host's own patcher class with Ferry's verbs
in front (``with_ferry``): ComfyUI's ModelPatcher (or a pack's subclass of it, ComfyUI-GGUF's
GGUFModelPatcher), Forge's UnetPatcher. Hosts clone a patcher at every node or script that
changes it, and some packs make the clone of their own class whatever the source's was
(GGUFModelPatcher.clone sets ``__class__`` back to GGUFModelPatcher), which would drop Ferry
silently: the output is still right, and the user believes Ferry saved the memory. Ferry's
``clone`` runs first (the mixin is first in the method order), so after the host's clone it
puts Ferry's class back in front of whatever class the clone has (``keep_ferry_class``).
Both hosts' mixins derive from ``FerryClones``, which does that and the loading mark.
"""

from __future__ import annotations

from typing import Any, ClassVar

_classes: dict[tuple[type, type], type] = {}


def with_ferry(mixin: type, base: type) -> type:
    """``base`` with ``mixin`` (a host's Ferry verbs) in front; one class per pair, so clones
    of one model share it; ``base`` itself where it already has the mixin."""
    if issubclass(base, mixin):
        return base
    key = (mixin, base)
    if key not in _classes:
        _classes[key] = type(f"Ferry{base.__name__}", (mixin, base), {})
    return _classes[key]


def keep_ferry_class(clone: Any, mixin: type) -> Any:
    """``clone`` (what the host's clone made) with Ferry's class back in front where the
    host's or a pack's clone replaced it; the pack's own class stays behind it."""
    if not isinstance(clone, mixin):
        clone.__class__ = with_ferry(mixin, type(clone))
    return clone


class FerryClones:
    """The clone verbs of a host's Ferry mixin: a host's mixin derives from this class and
    names what a clone shares with its source (``ferry_shared``) and how its layout is marked
    as loading (``_ferry_mark_loading``)."""

    #: The host's mixin (set for each class that derives from this one directly): the class
    #: ``clone`` puts back in front where a pack's clone replaced it.
    ferry_mixin: ClassVar[type]
    #: The attributes a clone shares with its source: how the host holds Ferry's settings.
    ferry_shared: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if FerryClones in cls.__bases__:
            cls.ferry_mixin = cls

    def clone(self, *args: Any, **kwargs: Any) -> Any:
        n = keep_ferry_class(super().clone(*args, **kwargs), self.ferry_mixin)  # type: ignore[misc]
        for name in self.ferry_shared:
            setattr(n, name, getattr(self, name))
        return n

    def is_clone(self, other: Any) -> bool:
        # The host's loader asks the patcher it is about to load (ComfyUI's load_models_gpu,
        # Forge's unload_model_clones): see seam/live_layout.py's Note.
        self._ferry_mark_loading()
        return bool(super().is_clone(other))  # type: ignore[misc]

    def _ferry_mark_loading(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} marks its layout as loading")
