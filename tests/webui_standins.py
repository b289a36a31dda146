"""Stand-ins for the parts of Stable Diffusion WebUI Forge that Ferry's WebUI host talks to.

Forge cannot run in CI, so these replay its contract as read from its source (the
2025-06-26 snapshot: backend/patcher/base.py, backend/patcher/unet.py, backend/patcher/lora.py,
backend/memory_management.py, modules/processing.py), written anew and reduced to what
Ferry's patcher meets:

- ``UnetPatcher.clone()`` builds a plain ``UnetPatcher`` (not ``type(self)``), copies its
  LoRA and object patches; ``is_clone`` is "same KModel".
- ``forge_patch_model(device)`` applies object patches, then moves the whole KModel;
  ``forge_unpatch_model(device)`` moves it and restores them.
- ``LoraLoader.refresh`` (shared by every clone, on the KModel) merges a LoRA set into the
  weights with ``set_attr`` of new Parameters, keeps the originals as backups, and does
  nothing when the set's hash equals the loaded one.
- ``load_models_gpu``: patchers compare by identity; a new one first asks ``loading.is_clone
  (old)`` of every loaded model and unloads those clones without moving them
  (``forge_unpatch_model()``), then ``model_load``: ``forge_patch_model(device)`` (or None,
  then its own CPU swap moves the returned module's submodules), then ``refresh_loras()``;
  an exception unpatches to the offload device and unloads. ``free_memory``/
  ``unload_all_models`` unload with ``forge_unpatch_model(offload_device)``.
- Its accounting: a model is sized by its parameters on and off its load device
  (``module_size``; the patcher's ``model_size()`` plays no part), a GPU frees 1.3x what is
  still to come plus a quarter of what is there, least recently loaded models first, and a
  model still short of room is swapped with the budget Forge computes; a CPU load device frees
  nothing and never swaps (tests/test_webui_standins.py).
- A generation: ``forge_objects`` is reset to the LoRA'd patcher, always-visible scripts'
  ``process_before_every_sampling`` runs (errors reported and swallowed, as Forge does),
  then the sampler loads the UNet through ``load_models_gpu`` and runs it.

The network is a small UNet-shaped model (input, middle and output block lists) whose
forward runs each block module, as Forge's IntegratedUNet2DConditionModel does.
"""

from __future__ import annotations

import copy
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch
from torch import nn

CPU = torch.device("cpu")


# ---- the network ------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(torch.tanh(self.to_q(self.norm(x))))


class TinyUNet(nn.Module):
    def __init__(self, dim: int = 64, n_in: int = 6, n_out: int = 6) -> None:
        super().__init__()
        self.conv_in = nn.Linear(dim, dim)
        self.input_blocks = nn.ModuleList(Block(dim) for _ in range(n_in))
        self.middle_block = nn.ModuleList([Block(dim)])
        self.output_blocks = nn.ModuleList(Block(dim) for _ in range(n_out))
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for blocks in (self.input_blocks, self.middle_block, self.output_blocks):
            for b in blocks:
                h = b(h)
        return self.out(h)


class Predictor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("sigmas", torch.linspace(0.1, 10.0, 16))


class KModel(nn.Module):
    def __init__(self, unet: nn.Module) -> None:
        super().__init__()
        self.diffusion_model = unet
        self.predictor = Predictor()

    def apply_model(self, x: torch.Tensor) -> torch.Tensor:
        return self.diffusion_model(x) * self.predictor.sigmas[0]


# ---- LoRA (backend/patcher/lora.py) -----------------------------------------------------
def get_attr(obj: Any, key: str) -> Any:
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def set_attr_raw(obj: Any, key: str, value: Any) -> None:
    *path, last = key.split(".")
    for part in path:
        obj = getattr(obj, part)
    setattr(obj, last, value)


class LoraLoader:
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.backup: dict[str, torch.Tensor] = {}
        self.loaded_hash = str([])
        self.merges = 0  # how many times a set was merged (stand-in bookkeeping)

    @torch.inference_mode()
    def refresh(self, lora_patches: dict[Any, Any], offload_device: torch.device = CPU) -> None:
        hashes = str(list(lora_patches.keys()))
        if hashes == self.loaded_hash:
            return
        for k, w in self.backup.items():
            set_attr_raw(
                self.model,
                k,
                w if isinstance(w, nn.Parameter) else nn.Parameter(w, requires_grad=False),
            )
        self.backup = {}
        merged: dict[str, list[Any]] = {}
        for patches in lora_patches.values():
            for key, ps in patches.items():
                merged.setdefault(key, []).extend(ps)
        for key, ps in merged.items():
            weight = get_attr(self.model, key)
            assert isinstance(weight, nn.Parameter), f"Wrong LoRA Key: {key}"
            if key not in self.backup:
                self.backup[key] = weight.to(device=offload_device)
            w = weight.to(torch.float32)
            for strength, (up, down) in ps:
                w = w + strength * (up.float() @ down.float())
            set_attr_raw(self.model, key, nn.Parameter(w.to(weight.dtype), requires_grad=False))
        self.loaded_hash = hashes
        self.merges += 1


# ---- patchers (backend/patcher/base.py, unet.py) ------------------------------------------
class ModelPatcher:
    def __init__(
        self, model: nn.Module, load_device: torch.device, offload_device: torch.device,
        size: int = 0, current_device: torch.device | None = None,
    ) -> None:  # fmt: skip
        self.size = size
        self.model = model
        self.lora_patches: dict[Any, Any] = {}
        self.object_patches: dict[str, Any] = {}
        self.object_patches_backup: dict[str, Any] = {}
        self.model_options: dict[str, Any] = {"transformer_options": {}}
        self.model_size()
        self.load_device = load_device
        self.offload_device = offload_device
        if not hasattr(model, "lora_loader"):
            model.lora_loader = LoraLoader(model)
        self.lora_loader = model.lora_loader
        self.current_device = offload_device if current_device is None else current_device

    def model_size(self) -> int:
        # Called from __init__ only (before load_device is set); nothing in Forge reads
        # ``size`` but clone(), which passes it on.
        if self.size > 0:
            return self.size
        self.size = module_size(self.model)
        return self.size

    def clone(self) -> ModelPatcher:
        n = ModelPatcher(
            self.model, self.load_device, self.offload_device, self.size, self.current_device
        )
        n.lora_patches = self.lora_patches.copy()
        n.object_patches = self.object_patches.copy()
        n.model_options = copy.deepcopy(self.model_options)
        return n

    def is_clone(self, other: Any) -> bool:
        return getattr(other, "model", None) is self.model

    def add_lora(
        self,
        name: str,
        patches: dict[str, tuple[torch.Tensor, torch.Tensor]],
        strength: float = 1.0,
    ) -> None:
        self.lora_patches[(name, strength, 1.0, False)] = {
            k: [(strength, v)] for k, v in patches.items()
        }

    def refresh_loras(self) -> None:
        self.lora_loader.refresh(self.lora_patches, offload_device=self.offload_device)

    def add_object_patch(self, name: str, obj: Any) -> None:
        self.object_patches[name] = obj

    def model_patches_to(self, device: Any) -> None:
        pass

    def model_dtype(self) -> torch.dtype:
        return torch.float32

    def forge_patch_model(self, target_device: torch.device | None = None) -> nn.Module:
        for k, item in self.object_patches.items():
            old = get_attr(self.model, k)
            self.object_patches_backup.setdefault(k, old)
            set_attr_raw(self.model, k, item)
        if target_device is not None:
            self.model.to(target_device)
            self.current_device = target_device
        return self.model

    def forge_unpatch_model(self, target_device: torch.device | None = None) -> None:
        if target_device is not None:
            self.model.to(target_device)
            self.current_device = target_device
        for k in list(self.object_patches_backup):
            set_attr_raw(self.model, k, self.object_patches_backup[k])
        self.object_patches_backup = {}


class UnetPatcher(ModelPatcher):
    def clone(self) -> UnetPatcher:
        n = UnetPatcher(
            self.model, self.load_device, self.offload_device, self.size, self.current_device
        )
        n.lora_patches = self.lora_patches.copy()
        n.object_patches = self.object_patches.copy()
        n.model_options = copy.deepcopy(self.model_options)
        return n


# ---- the memory manager (backend/memory_management.py) -----------------------------------
GIB = 1 << 30


def module_size(
    module: nn.Module,
    exclude_device: torch.device | None = None,
    include_device: torch.device | None = None,
) -> int:
    """memory_management.py ``module_size``: the bytes of a module's parameters (not its
    buffers), only those on ``include_device`` / not on ``exclude_device``. (Forge counts a
    bitsandbytes NF4/FP4 element as 0.55 or 1.1 bytes; no bnb here.)"""
    return sum(
        p.data.numel() * p.data.element_size()
        for p in module.parameters()
        if (exclude_device is None or p.device != exclude_device)
        and (include_device is None or p.device == include_device)
    )


def compute_model_gpu_memory_when_using_cpu_swap(free: int, inference: int) -> int:
    """memory_management.py, same name: what a swapped model may keep on the GPU, the larger
    of 1/1.3 of what inference leaves free and that less 1.25 GiB."""
    available = free - inference
    return int(max(0, max(available / 1.3, available - 1.25 * GIB)))


@dataclass
class LoadedModel:
    model: Any
    real_model: Any = None
    inclusive_memory: int = 0  # the model's bytes already on its load device
    exclusive_memory: int = 0  # and elsewhere
    swap_budget: int = -1  # what model_load was given (stand-in bookkeeping)
    moved: list[nn.Module] = field(default_factory=list)  # what Forge's swap moved itself

    @property
    def device(self) -> torch.device:
        return self.model.load_device

    def compute_inclusive_exclusive_memory(self) -> None:
        # LoadedModel.compute_inclusive_exclusive_memory: sized by where the KModel's
        # parameters are now, never by the patcher's model_size().
        self.inclusive_memory = module_size(self.model.model, include_device=self.device)
        self.exclusive_memory = module_size(self.model.model, exclude_device=self.device)

    def model_load(self, cpu_swap_budget: int = -1) -> None:
        self.swap_budget = cpu_swap_budget
        no_swap = cpu_swap_budget < 0
        try:
            self.real_model = self.model.forge_patch_model(self.device if no_swap else None)
            self.model.current_device = self.model.load_device
        except Exception:
            self.model.forge_unpatch_model(self.model.offload_device)
            self.model_unload()
            raise
        if not no_swap:
            # LoadedModel.model_load's CPU swap, over build_module_profile's split of the
            # returned module: a module of Forge's own ops (``parameters_manual_cast``) may
            # wait on the offload device and be cast per forward, within the budget; any other
            # module holding a weight goes to the GPU whole. (Which Forge op stays within the
            # budget is not modelled: a Ferry UNet hands Forge no module either way.)
            for m in self.real_model.modules():
                if hasattr(m, "parameters_manual_cast"):
                    m.to(self.model.offload_device)
                    self.moved.append(m)
                elif hasattr(m, "weight"):
                    m.to(self.device)
                    self.moved.append(m)
        self.model.refresh_loras()

    def model_unload(self, avoid_model_moving: bool = False) -> None:
        if avoid_model_moving:
            self.model.forge_unpatch_model()
        else:
            self.model.forge_unpatch_model(self.model.offload_device)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoadedModel) and self.model is other.model


class MemoryManager:
    """Forge's model list and its accounting.

    ``gpu``: the device that plays the GPU, of ``vram`` bytes; None: a CPU-only Forge
    (``--always-cpu``, as tests/forge runs it: VRAM state DISABLED, nothing is ever freed or
    swapped for a model loading to the CPU). Forge reads a GPU's free memory from the driver;
    here it is ``vram`` less the parameters on that device of every model this manager has
    loaded (Ferry's slots, which are no parameters, are not counted). CI has no GPU: its tests
    give the meta device that part, for models that never run.
    """

    def __init__(
        self, gpu: torch.device | None = None, vram: int = 0, inference_memory: int = GIB
    ) -> None:
        self.current_loaded_models: list[LoadedModel] = []
        self.gpu, self.vram = gpu, vram
        # current_inference_memory: 1 GiB unless the UI's GPU Weights slider changes it.
        self.inference_memory = inference_memory
        self.seen: weakref.WeakSet[nn.Module] = weakref.WeakSet()

    def get_free_memory(self, device: torch.device) -> int:
        if device != self.gpu:
            return int(psutil.virtual_memory().available)  # get_free_memory: the CPU's RAM
        return self.vram - sum(module_size(m, include_device=device) for m in self.seen)

    def unload_model_clones(self, model: Any) -> None:
        # unload_model_clones: every loaded patcher of the same KModel, without moving it.
        found = [i for i, lm in enumerate(self.current_loaded_models) if model.is_clone(lm.model)]
        for i in reversed(found):
            self.current_loaded_models.pop(i).model_unload(avoid_model_moving=True)

    def load_models_gpu(self, models: list[Any], memory_required: int = 0) -> None:
        inference = self.inference_memory
        memory_to_free = max(inference, memory_required)
        to_load, already = [], []
        for m in models:
            lm = LoadedModel(m)
            if lm in self.current_loaded_models:  # patchers compare by identity
                i = self.current_loaded_models.index(lm)
                self.current_loaded_models.insert(0, self.current_loaded_models.pop(i))
                already.append(lm)
            else:
                to_load.append(lm)
        if not to_load:
            for d in {lm.device for lm in already}:
                if d != CPU:
                    self.free_memory(memory_to_free, d, already)
            return
        for lm in to_load:
            self.unload_model_clones(lm.model)
        # load_models_gpu: each device must free 1.3 x (the bytes still to come there + a
        # quarter of those already there) + the inference memory; the CPU frees nothing.
        required: dict[torch.device, float] = {}
        for lm in to_load:
            lm.compute_inclusive_exclusive_memory()
            required[lm.device] = (
                required.get(lm.device, 0) + lm.exclusive_memory + lm.inclusive_memory * 0.25
            )
        for d, need in required.items():
            if d != CPU:
                self.free_memory(need * 1.3 + memory_to_free, d, already)
        for lm in to_load:
            budget = -1
            if lm.device != CPU:  # a CPU load device: VRAMState.DISABLED, no swap
                free = self.get_free_memory(lm.device)
                if free - lm.exclusive_memory - inference < 0:
                    # Too little room: the CPU swap, keeping on the GPU what
                    # compute_model_gpu_memory_when_using_cpu_swap allows, or exactly what
                    # is there already.
                    budget = compute_model_gpu_memory_when_using_cpu_swap(free, inference)
                    if lm.inclusive_memory > 0:
                        budget = lm.inclusive_memory
            self.seen.add(lm.model.model)
            lm.model_load(budget)
            self.current_loaded_models.insert(0, lm)

    def free_memory(
        self, memory_required: float, device: torch.device, keep_loaded: list[Any] = (),  # type: ignore[assignment]
        free_all: bool = False,
    ) -> None:  # fmt: skip
        # free_memory: first every patcher nothing but this list holds any more (abandoned),
        # unloaded without moving it ...
        for i in range(len(self.current_loaded_models) - 1, -1, -1):
            if sys.getrefcount(self.current_loaded_models[i].model) <= 2:
                self.current_loaded_models.pop(i).model_unload(avoid_model_moving=True)
        if free_all:
            memory_required = 1e30
        # ... then, least recently loaded first, every model on that device not in
        # keep_loaded, until the device has more than memory_required free.
        for i in range(len(self.current_loaded_models) - 1, -1, -1):
            if self.get_free_memory(device) > memory_required:
                break
            lm = self.current_loaded_models[i]
            if lm.device == device and lm not in keep_loaded:
                self.current_loaded_models.pop(i).model_unload()

    def unload_all_models(self) -> None:
        # unload_all_models: free_memory(1e30, get_torch_device(), free_all=True).
        self.free_memory(1e30, self.gpu or CPU, free_all=True)


# ---- a checkpoint and a generation (modules/processing.py) --------------------------------
@dataclass
class CheckpointInfo:
    filename: str
    model_name: str


@dataclass
class ForgeObjects:
    unet: Any

    def shallow_copy(self) -> ForgeObjects:
        return ForgeObjects(self.unet)


@dataclass
class SdModel:
    forge_objects: ForgeObjects
    forge_objects_original: ForgeObjects
    forge_objects_after_applying_lora: ForgeObjects
    sd_checkpoint_info: CheckpointInfo


def load_checkpoint(
    seed: int, name: str = "tiny", filename: str = "/nowhere/tiny.safetensors"
) -> SdModel:
    torch.manual_seed(seed)
    kmodel = KModel(TinyUNet())
    unet = UnetPatcher(kmodel, CPU, CPU)
    return SdModel(
        ForgeObjects(unet), ForgeObjects(unet), ForgeObjects(unet), CheckpointInfo(filename, name)
    )


@dataclass
class Processing:
    sd_model: SdModel
    extra_generation_params: dict[str, Any] = field(default_factory=dict)


def generate(
    mm: MemoryManager, sd: SdModel, scripts: list[tuple[Any, tuple[Any, ...]]], x: torch.Tensor,
    lora: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> tuple[torch.Tensor, Processing]:  # fmt: skip
    """One generation: LoRA (extra networks), always-visible scripts, load, one UNet call."""
    if lora is not None:
        unet = sd.forge_objects_original.unet.clone()
        unet.add_lora("lora", lora)
        sd.forge_objects_after_applying_lora = ForgeObjects(unet)
    else:
        sd.forge_objects_after_applying_lora = sd.forge_objects_original.shallow_copy()
    sd.forge_objects = sd.forge_objects_after_applying_lora.shallow_copy()
    p = Processing(sd)
    for script, args in scripts:
        try:
            script.process_before_every_sampling(p, *args, x=x)
        except Exception as e:  # Forge: errors.report(...), and the generation goes on
            print(f"*** Error running process_before_every_sampling: {e}")
    unet = sd.forge_objects.unet
    mm.load_models_gpu([unet])
    with torch.inference_mode():
        return unet.model.apply_model(x), p
