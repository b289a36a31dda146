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
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


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
    """backend/patcher/lora.py ``LoraLoader.refresh``: the set's patches grouped by (key, online
    mode); the previous set undone (online patches deleted from their layers, merged weights
    put back from their backups); then each online patch list put on its layer as
    ``forge_online_loras[child]`` (merged into the weight on every forward, operations.py), and
    each offline one merged: a GGUF weight is dequantized, merged in float32 and requantized
    into the same parameter (``gguf_cls.quantize_pytorch``), a plain one replaced by a new
    Parameter. (A bnb weight's merge calls ``.cuda()``: not modelled, CI has no GPU.)"""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.backup: dict[str, torch.Tensor] = {}
        self.online_backup: list[nn.Module] = []
        self.loaded_hash = str([])
        self.merges = 0  # how many times a set was merged (stand-in bookkeeping)

    @torch.inference_mode()
    def refresh(self, lora_patches: dict[Any, Any], offload_device: torch.device = CPU) -> None:
        hashes = str(list(lora_patches.keys()))
        if hashes == self.loaded_hash:
            return
        grouped: dict[tuple[str, bool], list[Any]] = {}
        for (_, _, _, online), patches in lora_patches.items():
            for key, ps in patches.items():
                grouped.setdefault((key, online), []).extend(ps)
        for m in set(self.online_backup):
            del m.forge_online_loras
        self.online_backup = []
        for k, w in self.backup.items():
            set_attr_raw(
                self.model,
                k,
                w if isinstance(w, nn.Parameter) else nn.Parameter(w, requires_grad=False),
            )
        self.backup = {}
        for (key, online), ps in grouped.items():
            *path, child = key.split(".")
            parent = get_attr(self.model, ".".join(path))
            weight = getattr(parent, child)
            assert isinstance(weight, nn.Parameter), f"Wrong LoRA Key: {key}"
            if online:
                if not hasattr(parent, "forge_online_loras"):
                    parent.forge_online_loras = {}
                parent.forge_online_loras[child] = ps
                self.online_backup.append(parent)
                continue
            if key not in self.backup:
                self.backup[key] = weight.to(device=offload_device)
            gguf_cls = getattr(weight, "gguf_cls", None)
            w = dequantize_tensor(weight) if gguf_cls is not None else weight
            w = merge_lora(ps, w, torch.float32)
            if gguf_cls is not None:
                gguf_cls.quantize_pytorch(w, weight)
                continue
            set_attr_raw(self.model, key, nn.Parameter(w, requires_grad=False))
        self.loaded_hash = hashes
        self.merges += 1


def merge_lora(patches: list[Any], weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """lora.py ``merge_lora_to_weight`` for plain LoRA patches (strength, (up, down)): the
    weight in ``dtype`` (a copy), each ``up @ down`` computed in ``dtype`` and added scaled,
    the result back in the weight's dtype."""
    w = weight.detach().to(dtype, copy=True)
    for strength, (up, down) in patches:
        w += (strength * (up.to(w.device, dtype) @ down.to(w.device, dtype))).type(w.dtype)
    return w.to(weight.dtype)


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
        online: bool = False,
    ) -> None:
        # add_patches: keyed by (filename, strength_patch, strength_model, online_mode).
        self.lora_patches[(name, strength, 1.0, online)] = {
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
        bake_gguf_model(self.real_model)  # on what forge_patch_model returned
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
    clip: Any = None  # a CLIP (text_encoder_checkpoint): None in the UNet-only checkpoints

    def shallow_copy(self) -> ForgeObjects:
        return ForgeObjects(self.unet, self.clip)


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
    steps: int = 20  # the Steps and CFG Scale sliders' values (Forge's defaults)
    cfg_scale: float = 7.0


def run_scripts(
    p: Processing, scripts: list[tuple[Any, tuple[Any, ...]]], hook: str, **kwargs: Any
) -> None:
    """scripts.py ``ScriptRunner``: each always-visible script's ``hook`` with its args; an
    error is reported and the generation goes on, as Forge does (errors.report)."""
    for script, args in scripts:
        try:
            getattr(script, hook)(p, *args, **kwargs)
        except Exception as e:
            print(f"*** Error running {hook}: {e}")


def generate(
    mm: MemoryManager, sd: SdModel, scripts: list[tuple[Any, tuple[Any, ...]]], x: torch.Tensor,
    lora: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None, online: bool = False,
    steps: int = 20, cfg_scale: float = 7.0,
) -> tuple[torch.Tensor, Processing]:  # fmt: skip
    """One generation: LoRA (extra networks), always-visible scripts, load, one UNet call.

    ``online``: Forge's "(fp16 LoRA)" options, which sd_forge_lora's networks.py honours only
    for a low-bit UNet (its storage dtype not float32/16/bf16)."""
    if lora is not None:
        unet = sd.forge_objects_original.unet.clone()
        storage = getattr(unet.model, "storage_dtype", torch.float32)
        unet.add_lora("lora", lora, online=online and storage not in FLOATS)
        sd.forge_objects_after_applying_lora = ForgeObjects(unet)
    else:
        sd.forge_objects_after_applying_lora = sd.forge_objects_original.shallow_copy()
    sd.forge_objects = sd.forge_objects_after_applying_lora.shallow_copy()
    p = Processing(sd, steps=steps, cfg_scale=cfg_scale)
    run_scripts(p, scripts, "process_before_every_sampling", x=x)
    unet = sd.forge_objects.unet
    mm.load_models_gpu([unet])
    with torch.inference_mode():
        return unet.model.apply_model(x), p


# ---- Forge's low-bit weights and ops ------------------------------------------------------
# Written from what Forge's files do (backend/operations.py, operations_gguf.py,
# operations_bnb.py, packages_3rdparty/gguf/quants.py, memory_management.py's
# bake_gguf_model): none of their lines, the same behaviour where Ferry meets it.
Q8_0_BLOCK, Q8_0_BYTES = 32, 34  # values per block; bytes per block (fp16 scale + 32 int8)


class Q8_0:
    """quants.py's ``Q8_0`` as Forge's ops call it. ``bake``: the raw rows re-cut into
    (blocks, 34) int8 with each block's fp16 scale cast to the parameter's computation dtype,
    in place (``parameter.data =``), once (``baked``). ``dequantize_pytorch``: scale * int8,
    shaped as the parameter's ``.shape`` reports; refuses an unbaked parameter, as Forge's
    does. ``quantize_pytorch``: a float weight requantized into the (baked) parameter."""

    @classmethod
    def bake(cls, p: Any) -> None:
        if p.baked:
            return
        blocks = p.data.reshape(-1, p.data.shape[-1]).view(torch.uint8).reshape(-1, Q8_0_BYTES)
        d = blocks[:, :2].contiguous().view(torch.float16).to(p.computation_dtype)
        p.data = torch.cat([d.view(torch.int8), blocks[:, 2:].view(torch.int8)], -1).contiguous()
        p.baked = True

    @classmethod
    def dequantize_pytorch(cls, p: Any) -> torch.Tensor:
        if not p.baked:
            raise ValueError("GGUF Tensor is not baked!")
        d = p.data[:, :2].contiguous().view(p.computation_dtype)
        return (p.data[:, 2:] * d).view(p.shape)

    @classmethod
    def quantize_pytorch(cls, weight: torch.Tensor, p: Any) -> Any:
        if not p.baked:
            raise ValueError("GGUF Tensor is not baked!")
        blocks = weight.reshape(-1, Q8_0_BLOCK)
        d = blocks.abs().max(dim=1, keepdim=True).values / 127
        qs = torch.round(blocks * torch.where(d == 0, torch.zeros_like(d), 1 / d))
        d = d.to(p.computation_dtype).view(torch.int8)
        p.data = torch.cat([d, qs.to(torch.int8)], dim=1).contiguous()
        return p


def q8_0_rows(w: torch.Tensor) -> torch.Tensor:
    """A float weight as a GGUF file stores Q8_0 (what GGUFReader hands Forge): uint8 rows."""
    blocks = w.float().reshape(-1, Q8_0_BLOCK)
    d = blocks.abs().max(dim=1, keepdim=True).values / 127
    qs = torch.round(blocks * torch.where(d == 0, torch.zeros_like(d), 1 / d)).to(torch.int8)
    raw = torch.cat([d.to(torch.float16).view(torch.uint8), qs.view(torch.uint8)], dim=1)
    return raw.reshape(w.shape[0], -1)


@dataclass
class ReaderTensor:
    """What gguf.GGUFReader gives Forge per tensor: raw data, type, shape (GGUF order)."""

    data: torch.Tensor
    tensor_type: str  # "Q8_0", "F16", "F32"
    shape: tuple[int, ...]


class ParameterGGUF(nn.Parameter):
    """operations_gguf.py ``ParameterGGUF``: a Parameter whose storage is a copy of the file's
    raw data, whose ``.shape`` is the dequantized shape (``real_shape``), and whose Python
    attributes (``gguf_cls``: None for F16/F32; ``computation_dtype``; ``baked``) drive
    ``dequantize_tensor``; ``to``/``pin_memory`` return a new one with the same attributes."""

    def __new__(cls, tensor: Any = None, requires_grad: bool = False, no_init: bool = False) -> Any:
        return super().__new__(cls, tensor.data.clone(), requires_grad=requires_grad)

    def __init__(self, tensor: Any = None, requires_grad: bool = False, no_init: bool = False):
        super().__init__()
        if no_init:
            return
        self.gguf_cls = Q8_0 if tensor.tensor_type == "Q8_0" else None
        self.real_shape = torch.Size(reversed(list(tensor.shape)))
        self.computation_dtype = torch.float16
        self.baked = False

    @property  # type: ignore[override]
    def shape(self) -> torch.Size:
        return self.real_shape

    def copy_with_data(self, data: torch.Tensor) -> ParameterGGUF:
        new = ParameterGGUF(data, no_init=True)
        new.gguf_cls, new.real_shape = self.gguf_cls, self.real_shape
        new.computation_dtype, new.baked = self.computation_dtype, self.baked
        return new

    def to(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return self.copy_with_data(self.data.to(*args, **kwargs))

    def pin_memory(self, device: Any = None) -> Any:  # type: ignore[override]
        return self.copy_with_data(torch.Tensor.pin_memory(self))


def dequantize_tensor(t: Any) -> Any:
    """operations_gguf.py: the float weight of a GGUF parameter; any other tensor as it is."""
    if t is None or getattr(t, "gguf_cls", None) is None:
        return t
    return t.gguf_cls.dequantize_pytorch(t)


def bake_gguf_model(model: nn.Module) -> None:
    """memory_management.py ``bake_gguf_model``: once per model, every GGUF parameter baked."""
    if getattr(model, "gguf_baked", False):
        return
    for p in model.parameters():
        if getattr(p, "gguf_cls", None) is not None:
            p.gguf_cls.bake(p)
    model.gguf_baked = True


def tensor2parameter(x: torch.Tensor) -> nn.Parameter:
    return x if isinstance(x, nn.Parameter) else nn.Parameter(x, requires_grad=False)


def get_weight_and_bias(
    layer: nn.Module, x: torch.Tensor | None = None, weight_fn: Any = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """operations.py ``get_weight_and_bias`` (through ``weights_manual_cast`` when ``x`` is
    given): the weight through ``weight_fn`` (dequantization), moved and cast to ``x``'s device
    and dtype, then the layer's online LoRA merged into it in that dtype; the bias moved (not
    cast, ``skip_bias_dtype``)."""
    patches = getattr(layer, "forge_online_loras", None)
    weight = layer.weight
    if weight_fn is not None:
        if x is not None:
            weight = weight.to(device=x.device)
        weight = weight_fn(weight)
    if x is not None:
        weight = weight.to(device=x.device, dtype=x.dtype)
    if patches is not None and "weight" in patches:
        weight = merge_lora(patches["weight"], weight, weight.dtype)
    bias = layer.bias
    if bias is not None and x is not None:
        bias = bias.to(device=x.device)
    if patches is not None and bias is not None and "bias" in patches:
        bias = merge_lora(patches["bias"], bias, bias.dtype)
    return weight, bias


class GGUFLinear(nn.Module):
    """operations.py ``ForgeOperationsGGUF.Linear``: a weight and bias loaded as the checkpoint's
    GGUF parameters (their computation dtype 16-bit), moved by ``_apply`` as new parameters;
    its forward first replaces a bias whose dtype is not the input's, and an unquantized weight
    whose dtype is not, by cast copies (module attributes changed during the forward), then
    computes with the dequantized weight cast to the input's dtype, online LoRA merged."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.dummy = nn.Parameter(torch.empty(1, dtype=dtype))
        self.weight: Any = None
        self.bias: Any = None
        self.parameters_manual_cast = False

    def _load_from_state_dict(self, sd: dict[str, Any], prefix: str, *args: Any) -> None:
        computation = self.dummy.dtype
        if computation not in (torch.float16, torch.bfloat16):
            computation = torch.float16
        for name in ("weight", "bias"):
            if prefix + name in sd:
                t = sd[prefix + name].to(device=self.dummy.device)
                t.computation_dtype = computation
                setattr(self, name, t)
        del self.dummy

    def _apply(self, fn: Any, recurse: bool = True) -> GGUFLinear:
        for k, p in self.named_parameters(recurse=False):
            setattr(self, k, tensor2parameter(fn(p)))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None and self.bias.dtype != x.dtype:
            self.bias = tensor2parameter(dequantize_tensor(self.bias).to(x.dtype))
        if self.weight.dtype != x.dtype and getattr(self.weight, "gguf_cls", None) is None:
            self.weight = tensor2parameter(self.weight.to(x.dtype))
        weight, bias = get_weight_and_bias(self, x, weight_fn=dequantize_tensor)
        return torch.nn.functional.linear(x, weight, bias)


class GGUFBlock(Block):
    def __init__(self, dim: int) -> None:
        nn.Module.__init__(self)
        self.norm = nn.LayerNorm(dim)
        self.to_q = GGUFLinear()
        self.proj = GGUFLinear()


class GGUFUNet(TinyUNet):
    """TinyUNet built under Forge's GGUF operations: every Linear a GGUFLinear."""

    def __init__(self, dim: int = 64, n_in: int = 6, n_out: int = 6) -> None:
        nn.Module.__init__(self)
        self.conv_in = GGUFLinear()
        self.input_blocks = nn.ModuleList(GGUFBlock(dim) for _ in range(n_in))
        self.middle_block = nn.ModuleList([GGUFBlock(dim)])
        self.output_blocks = nn.ModuleList(GGUFBlock(dim) for _ in range(n_out))
        self.out = GGUFLinear()


#: Which of the tiny UNet's weights the stand-in GGUF file keeps unquantized, and in what:
#: one F16 weight and one F16 bias, so the forward's cast-and-replace runs (the input is F32).
GGUF_F16 = ("conv_in.weight", "out.bias")


def gguf_file(seed: int) -> dict[str, ReaderTensor]:
    """A GGUF file's tensors for the tiny UNet: 2-D weights Q8_0, the rest F32 (GGUF_F16: F16)."""
    torch.manual_seed(seed)
    out = {}
    for k, t in TinyUNet().state_dict().items():
        gguf_shape = tuple(reversed(t.shape))
        if k in GGUF_F16:
            out[k] = ReaderTensor(t.to(torch.float16), "F16", gguf_shape)
        elif t.dim() == 2:
            out[k] = ReaderTensor(q8_0_rows(t), "Q8_0", gguf_shape)
        else:
            out[k] = ReaderTensor(t.clone(), "F32", gguf_shape)
    return out


def load_gguf_checkpoint(seed: int, name: str = "tiny-gguf") -> SdModel:
    """backend/utils.py ``load_torch_file`` (every tensor a ParameterGGUF) and the loader's
    UNet under the GGUF operations: LayerNorms take a copy (``param.copy_``), the Linears the
    parameters themselves; storage dtype 'gguf'."""
    sd = {k: ParameterGGUF(t) for k, t in gguf_file(seed).items()}
    unet = GGUFUNet()
    for k, m in unet.named_modules():
        prefix = f"{k}." if k else ""
        if isinstance(m, GGUFLinear):
            m._load_from_state_dict(sd, prefix)
        elif isinstance(m, nn.LayerNorm):
            with torch.no_grad():
                m.weight.copy_(sd[prefix + "weight"])
                m.bias.copy_(sd[prefix + "bias"])
    kmodel = KModel(unet)
    kmodel.storage_dtype = "gguf"
    patcher = UnetPatcher(kmodel, CPU, CPU)
    return SdModel(
        ForgeObjects(patcher), ForgeObjects(patcher), ForgeObjects(patcher),
        CheckpointInfo(f"/nowhere/{name}.gguf", name),
    )  # fmt: skip


# -- bitsandbytes NF4 (operations_bnb.py; bitsandbytes' Params4bit and QuantState) -----------
#: The 16 NF4 levels (bitsandbytes' NF4 code: quantiles of N(0, 1), scaled to [-1, 1]).
NF4_CODE = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
])  # fmt: skip
NF4_BLOCK = 64


@dataclass
class QuantState:
    """bitsandbytes' ``QuantState``: separate tensors beside the packed weight (absmax per
    block, the code), and what the weight's logical shape and dtype are."""

    absmax: torch.Tensor
    code: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype
    blocksize: int = NF4_BLOCK
    quant_type: str = "nf4"
    offset: torch.Tensor | None = None
    state2: QuantState | None = None


def copy_quant_state(state: QuantState, device: torch.device) -> QuantState:
    """operations_bnb.py ``copy_quant_state``: the state's tensors copied to ``device``."""
    return QuantState(
        state.absmax.to(device), state.code.to(device), state.shape, state.dtype,
        state.blocksize, state.quant_type,
    )  # fmt: skip


class Params4bit(nn.Parameter):
    """``ForgeParams4bit`` (a bitsandbytes ``Params4bit``): the packed 4-bit bytes are the
    parameter's storage; ``quant_state`` is an attribute holding its own tensors; ``to()``
    returns a new parameter whose state is copied to the target device."""

    def __new__(
        cls, data: torch.Tensor, quant_state: QuantState, bnb_quantized: bool = True
    ) -> Any:
        return super().__new__(cls, data, requires_grad=False)

    def __init__(self, data: torch.Tensor, quant_state: QuantState, bnb_quantized: bool = True):
        super().__init__()
        self.quant_state = quant_state
        self.quant_type = quant_state.quant_type
        self.blocksize = quant_state.blocksize
        self.bnb_quantized = bnb_quantized

    def to(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        device = torch._C._nn._parse_to(*args, **kwargs)[0] or self.device
        return Params4bit(
            nn.Parameter.to(self, device=device).data,
            copy_quant_state(self.quant_state, device),
            self.bnb_quantized,
        )


def quantize_nf4(w: torch.Tensor) -> Params4bit:
    """A float weight as an NF4 checkpoint holds it: nearest NF4 level per value, two per byte."""
    blocks = w.float().reshape(-1, NF4_BLOCK)
    absmax = blocks.abs().max(dim=1).values
    idx = (blocks / absmax[:, None]).unsqueeze(-1).sub(NF4_CODE).abs().argmin(-1).flatten()
    packed = (idx[0::2] << 4 | idx[1::2]).to(torch.uint8).reshape(-1, 1)
    return Params4bit(packed, QuantState(absmax, NF4_CODE.clone(), w.shape, w.dtype))


def dequantize_4bit(weight: torch.Tensor, state: QuantState) -> torch.Tensor:
    """bitsandbytes' ``dequantize_4bit``: its kernel reads the packed bytes and the state on
    the weight's device, and fails on a state elsewhere."""
    for t in (state.absmax, state.code):
        if t.device != weight.device:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found {t.device} and "
                f"{weight.device}"
            )
    raw = weight.detach().as_subclass(torch.Tensor).flatten().to(torch.int64)
    idx = torch.stack([raw >> 4, raw & 15], dim=1).flatten()
    values = state.code[idx].reshape(-1, state.blocksize) * state.absmax[:, None]
    return values.reshape(state.shape).to(state.dtype)


class NF4Linear(nn.Module):
    """operations.py ``ForgeOperationsBNB4bits.Linear`` (no online LoRA: its dequantization
    calls ``.cuda()``): ``functional_linear_4bits`` on the weight and its quant_state."""

    def __init__(self, weight: Params4bit, bias: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight
        self.bias = nn.Parameter(bias, requires_grad=False)
        self.parameters_manual_cast = False

    def _apply(self, fn: Any, recurse: bool = True) -> NF4Linear:
        for k, p in self.named_parameters(recurse=False):
            setattr(self, k, tensor2parameter(fn(p)))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = dequantize_4bit(self.weight, self.weight.quant_state)
        return torch.nn.functional.linear(x, w.to(x.dtype), self.bias)


def load_nf4_checkpoint(seed: int, name: str = "tiny-nf4") -> SdModel:
    """The tiny UNet from a pre-quantized NF4 checkpoint: every block Linear an NF4Linear."""
    sd = load_checkpoint(seed, name, f"/nowhere/{name}.safetensors")
    kmodel = sd.forge_objects.unet.model
    kmodel.storage_dtype = "nf4"
    for block in kmodel.diffusion_model.modules():
        if isinstance(block, Block):
            for attr in ("to_q", "proj"):
                lin = getattr(block, attr)
                setattr(block, attr, NF4Linear(quantize_nf4(lin.weight.data), lin.bias.data))
    return sd


# ---- text encoders (backend/patcher/clip.py, backend/text_processing, diffusion_engine) -----
class TextEncoder(nn.Module):
    """A CLIP- or T5-shaped encoder: token embedding, a list of repeated layers (Forge's
    ``transformer.text_model.encoder.layers`` / T5 ``block``), a final norm."""

    def __init__(self, dim: int = 32, n_layers: int = 4, vocab: int = 50) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(n_layers))
        self.final_norm = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.final_norm(h)


class JointTextEncoder(nn.Module):
    """clip.py ``JointTextEncoder``: backend/nn/base.py's ``ModuleDict``, which is a plain
    Module with each of the checkpoint's encoders added as a child (no ``keys``, no ``[k]``:
    Forge reads them as attributes)."""

    def __init__(self, encoders: dict[str, nn.Module]) -> None:
        super().__init__()
        for name, module in encoders.items():
            self.add_module(name, module)


class CLIP:
    """clip.py ``CLIP``: ``patcher`` is a plain ModelPatcher over ``cond_stage_model`` (the
    joint encoder itself); ``clone()`` shares the joint and clones the patcher."""

    def __init__(self, encoders: dict[str, nn.Module] | None = None) -> None:
        if encoders is None:
            return  # clip.py's no_init
        self.cond_stage_model = JointTextEncoder(encoders)
        self.patcher = ModelPatcher(self.cond_stage_model, CPU, CPU)

    def clone(self) -> CLIP:
        n = CLIP()
        n.patcher = self.patcher.clone()
        n.cond_stage_model = self.cond_stage_model
        return n


class TextProcessingEngine:
    """classic_engine.py / t5_engine.py: holds its encoder (``text_encoder``, a module of the
    joint, taken when the checkpoint loads) and runs it through ``encode_with_transformers``
    once per chunk of tokens."""

    def __init__(self, text_encoder: nn.Module, chunk: int = 6) -> None:
        self.text_encoder = text_encoder
        self.chunk = chunk

    def encode_with_transformers(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.text_encoder(tokens)  # type: ignore[no-any-return]

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        chunks = tokens.split(self.chunk, dim=1)
        return torch.cat([self.encode_with_transformers(c) for c in chunks], dim=1)


@dataclass
class TextSdModel(SdModel):
    """An SdModel with a CLIP and one engine per encoder (sd15.py: text_processing_engine;
    sdxl.py / flux.py: _l, _g, _t5)."""

    engines: dict[str, TextProcessingEngine] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, engine in self.engines.items():
            setattr(self, f"text_processing_engine_{name}", engine)

    def get_learned_conditioning(self, mm: MemoryManager, tokens: torch.Tensor) -> torch.Tensor:
        """sd15.py / sdxl.py ``get_learned_conditioning``: load the CLIP's patcher, then each
        engine encodes (their outputs joined on the feature axis, as sdxl.py does)."""
        mm.load_models_gpu([self.forge_objects.clip.patcher])
        with torch.inference_mode():
            return torch.cat([e(tokens) for e in self.engines.values()], dim=-1)


def load_text_checkpoint(
    seed: int, encoders: tuple[str, ...] = ("clip_l",), name: str = "tiny-te"
) -> TextSdModel:
    """A checkpoint with a UNet and a CLIP of ``encoders`` (e.g. ("clip_l", "t5xxl"))."""
    base = load_checkpoint(seed, name, f"/nowhere/{name}.safetensors")
    torch.manual_seed(seed + 1)
    clip = CLIP({k: TextEncoder(n_layers=4 + 2 * i) for i, k in enumerate(encoders)})
    unet = base.forge_objects.unet
    engines = {k: TextProcessingEngine(getattr(clip.cond_stage_model, k)) for k in encoders}
    return TextSdModel(
        ForgeObjects(unet, clip), ForgeObjects(unet, clip), ForgeObjects(unet, clip),
        base.sd_checkpoint_info, engines,
    )  # fmt: skip


def encode_batch(
    mm: MemoryManager, sd: TextSdModel, scripts: list[tuple[Any, tuple[Any, ...]]],
    tokens: torch.Tensor, lora: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> tuple[torch.Tensor, Processing]:  # fmt: skip
    """processing.py ``process_images_inner`` up to the prompts' conditioning: LoRA on the CLIP
    (sd_forge_lora: a clone with the patches), ``forge_objects`` reset to the LoRA'd objects,
    always-visible scripts' ``process_batch`` (errors reported and swallowed), then
    ``setup_conds`` (``get_learned_conditioning``)."""
    if lora is not None:
        clip = sd.forge_objects_original.clip.clone()
        clip.patcher.add_lora("lora", lora)
        sd.forge_objects_after_applying_lora = ForgeObjects(sd.forge_objects_original.unet, clip)
    else:
        sd.forge_objects_after_applying_lora = sd.forge_objects_original.shallow_copy()
    sd.forge_objects = sd.forge_objects_after_applying_lora.shallow_copy()
    p = Processing(sd)
    run_scripts(p, scripts, "process_batch")
    return sd.get_learned_conditioning(mm, tokens), p
