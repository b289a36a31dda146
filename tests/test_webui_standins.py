"""The Forge stand-in's memory manager (tests/webui_standins.py) keeps Forge's accounting:
models sized by their parameters per device, 1.3x what a load needs freed, least recently
loaded first, a quarter of what is already on the device, the CPU swap's budget.

CI has no GPU: the meta device plays it, for models that never run (a text encoder and a VAE
beside the UNet, as Forge holds them). A move keeps their shapes only."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from tests import webui_standins as forge

META, CPU = torch.device("meta"), forge.CPU
INFERENCE = 4096  # Forge's inference memory (1 GiB there): small, beside these small models


class SizeOnly(forge.ModelPatcher):
    def forge_patch_model(self, target_device: torch.device | None = None) -> nn.Module:
        if target_device is not None:
            self.model.to_empty(device=target_device)
            self.current_device = target_device
        return self.model

    def forge_unpatch_model(self, target_device: torch.device | None = None) -> None:
        if target_device is not None:
            self.model.to_empty(device=target_device)
            self.current_device = target_device


def size_only(n: int) -> tuple[SizeOnly, int]:
    """A patcher of an n x n Linear waiting on the CPU, and its bytes (weight and bias)."""
    return SizeOnly(nn.Linear(n, n), META, CPU), (n * n + n) * 4


def manager(vram: int) -> forge.MemoryManager:
    return forge.MemoryManager(gpu=META, vram=vram, inference_memory=INFERENCE)


def loaded(mm: forge.MemoryManager) -> list[Any]:
    return [lm.model for lm in mm.current_loaded_models]


def test_a_load_frees_1_3x_its_bytes_least_recently_loaded_first() -> None:
    for margin, unloaded in ((1, ["te"]), (0, ["te", "vae"])):
        (te, _), (vae, vae_b), (unet, unet_b) = size_only(128), size_only(64), size_only(256)
        # Room for the VAE beside 1.3 x the UNet (all of it still on the CPU) and the
        # inference memory, then not quite: free memory must exceed what is asked for.
        mm = manager(vae_b + math.floor(1.3 * unet_b) + INFERENCE + margin)
        mm.load_models_gpu([te])
        mm.load_models_gpu([vae])
        assert loaded(mm) == [vae, te]
        mm.load_models_gpu([unet])
        models = {"te": te, "vae": vae}
        gone = [n for n, p in models.items() if p not in loaded(mm)]
        assert gone == unloaded and loaded(mm)[0] is unet
        assert all(t.device == CPU for n in gone for t in models[n].model.parameters())
        lm = mm.current_loaded_models[0]
        assert (lm.exclusive_memory, lm.inclusive_memory) == (unet_b, 0)
        assert lm.swap_budget == -1  # it fitted: no CPU swap


def test_a_clone_of_a_loaded_model_needs_a_quarter_of_what_is_already_there() -> None:
    for margin, vae_stays in ((1, True), (0, False)):
        (te, te_b), (vae, vae_b) = size_only(128), size_only(64)
        mm = manager(te_b + vae_b + math.floor(1.3 * 0.25 * te_b) + INFERENCE + margin)
        mm.load_models_gpu([vae])
        mm.load_models_gpu([te])
        again = SizeOnly(te.model, META, CPU)  # a new patcher of the same model: a clone
        mm.load_models_gpu([again])
        assert te not in loaded(mm), "the old patcher is unloaded, its weights left in place"
        assert (vae in loaded(mm)) is vae_stays
        lm = mm.current_loaded_models[0]
        assert lm.model is again and (lm.inclusive_memory, lm.exclusive_memory) == (te_b, 0)


def test_a_model_without_room_is_swapped_with_forges_budget() -> None:
    unet, unet_b = size_only(256)
    mm = manager(INFERENCE + unet_b // 4)
    mm.load_models_gpu([unet])
    lm = mm.current_loaded_models[0]
    # max(what inference leaves / 1.3, that less 1.25 GiB)
    assert lm.swap_budget == int((unet_b // 4) / 1.3)
    assert lm.moved == [unet.model]  # a plain Linear goes to the GPU whole
    # Loaded again by a new patcher: it keeps exactly what it has on the GPU.
    again = SizeOnly(unet.model, META, CPU)
    mm.load_models_gpu([again])
    assert mm.current_loaded_models[0].swap_budget == unet_b


def test_a_cpu_load_frees_nothing_and_never_swaps() -> None:
    """A load device that is the CPU (``--always-cpu``, as tests/forge runs Forge): nothing is
    freed for it, however much the load asks for, and nothing is swapped."""
    mm = forge.MemoryManager(gpu=META, vram=1, inference_memory=1 << 60)
    first = forge.UnetPatcher(nn.Linear(64, 64), CPU, CPU)
    mm.load_models_gpu([first])
    unet = forge.UnetPatcher(nn.Linear(512, 512), CPU, CPU)
    mm.load_models_gpu([unet], memory_required=1 << 61)
    assert loaded(mm) == [unet, first]
    assert [lm.swap_budget for lm in mm.current_loaded_models] == [-1, -1]


def test_unload_all_models_unloads_every_model_on_the_gpu() -> None:
    (te, _), (vae, _) = size_only(128), size_only(64)
    mm = manager(1 << 30)
    mm.load_models_gpu([te])
    mm.load_models_gpu([vae])
    mm.unload_all_models()
    assert loaded(mm) == []
    assert {t.device for p in (te, vae) for t in p.model.parameters()} == {CPU}
    assert mm.get_free_memory(META) == 1 << 30


def test_an_abandoned_patcher_is_unloaded_without_moving_it() -> None:
    te, _ = size_only(128)
    weights = te.model
    unet, _ = size_only(64)
    mm = manager(1 << 30)  # room for everything: only the abandoned rule unloads
    mm.load_models_gpu([te])
    del te  # Forge's list is all that holds that patcher now
    mm.load_models_gpu([unet])
    assert loaded(mm) == [unet]
    assert {t.device for t in weights.parameters()} == {META}
