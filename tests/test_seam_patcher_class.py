"""Ferry's hold on a host's patcher survives a clone that sets the patcher's class back to a
pack's own (ComfyUI-GGUF's GGUFModelPatcher.clone does; tests/gguf_standin.py
``clone_resets_class``): seam/patcher_class.py, used by both hosts. The real pack in real
ComfyUI: tests/comfyui/test_comfyui_gguf.py (a cloning node after Ferry)."""

from __future__ import annotations

import importlib
from typing import Any

from tests import webui_standins as forge
from tests.conftest import PACK_NAME, load_pack
from tests.gguf_standin import clone_resets_class

load_pack()
seam = importlib.import_module(f"{PACK_NAME}.seam.patcher_class")
webui_patcher = importlib.import_module(f"{PACK_NAME}.webui.patcher")
oc = importlib.import_module(f"{PACK_NAME}.offload_core")


class CorePatcher:
    """A host's patcher whose clone makes its own class (ComfyUI's ModelPatcher.clone:
    ``self.__class__(...)``, with the source's fields copied)."""

    def __init__(self, model: object) -> None:
        self.model = model
        self.fields: dict[str, Any] = {}

    def clone(self) -> Any:
        n = self.__class__(self.model)
        n.fields = dict(self.fields)
        return n


class PackPatcher(CorePatcher):
    """A pack's subclass whose clone resets the class, as GGUFModelPatcher's does."""


PackPatcher.clone = clone_resets_class(PackPatcher)  # type: ignore[method-assign]


class Ferry:
    """A host's Ferry verbs: its clone keeps the class (what both hosts' mixins do)."""

    config: object = None

    def clone(self) -> Any:
        n = seam.keep_ferry_class(super().clone(), Ferry)  # type: ignore[misc]
        n.config = self.config
        return n


def test_with_ferry_is_one_class_per_base_and_keeps_the_pack_behind_it() -> None:
    cls = seam.with_ferry(Ferry, PackPatcher)
    assert seam.with_ferry(Ferry, PackPatcher) is cls
    assert cls.__mro__[:3] == (cls, Ferry, PackPatcher)
    assert seam.with_ferry(Ferry, cls) is cls


def test_the_packs_reset_would_drop_ferry() -> None:
    """The premise: without keep_ferry_class, a pack's clone loses a Ferry subclass."""
    p = PackPatcher("model")
    p.__class__ = type("FerryNaive", (PackPatcher,), {})
    assert type(p.clone()) is PackPatcher


def test_clones_of_clones_keep_ferry_and_the_pack() -> None:
    p = PackPatcher("model")
    p.__class__ = seam.with_ferry(Ferry, PackPatcher)
    p.config = "cfg"
    n = p
    for _ in range(3):  # Ferry -> ModelSampling -> LoRA -> ...
        n = n.clone()
        assert isinstance(n, Ferry) and isinstance(n, PackPatcher), type(n)
        assert n.config == "cfg" and n.model == "model"
    assert type(p) is seam.with_ferry(Ferry, PackPatcher), "the source keeps its class"


class ForgePackUnet(forge.UnetPatcher):
    """A Forge UNet patcher from a pack that resets its class on clone."""


ForgePackUnet.clone = clone_resets_class(ForgePackUnet)  # type: ignore[method-assign]


def test_forges_ferry_patcher_survives_a_pack_clone() -> None:
    unet = ForgePackUnet(forge.KModel(forge.TinyUNet()), forge.CPU, forge.CPU)
    held = webui_patcher.ferry_clone(unet, None, refusal=oc.FerryError("held, not laid out"))
    n = held.clone().clone()
    assert isinstance(n, webui_patcher.FerryPatcherMixin) and isinstance(n, ForgePackUnet)
    assert n.ferry_refusal is held.ferry_refusal
