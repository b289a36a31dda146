"""The ComfyUI side of the head-to-head: real ComfyUI code, in process, one row per process.

Every row samples the same ComfyUI model (``comfy.sd.load_diffusion_model``) with the same
KSampler (``nodes.common_ksampler``); only how the weights reach the device differs:

- ``resident``: ComfyUI's own full load, no cap.
- ``comfy-lowvram`` / ``comfy-lowvram-async``: ComfyUI's partial loading at the cap (v0.3.64:
  ``load_models_gpu`` computes ``lowvram_model_memory`` from free VRAM; ``--async-offload``
  gives it 2 offload streams). This version has no pinned-memory flag.
- ``ferry-pinned`` / ``ferry-ram`` / ``ferry-disk``: the pack loaded as ComfyUI loads it
  (``nodes.load_custom_node`` on a hyphenated folder), its "Ferry Offload Model" node run on
  the MODEL, ``vram_budget`` auto (GPU) or the cap (CPU).
- ``diffusers-block`` / ``diffusers-disk``: ``diffusers.hooks.apply_group_offloading`` (block
  level, one block per group, streams on a GPU) on the same diffusion model, behind a small
  ModelPatcher subclass so ComfyUI's loader leaves the placement to diffusers.

The ``dyn-*`` rows run on a second, current core (ComfyUI >= 0.15; v0.33 here) with what it
turns on by default on an NVIDIA card: dynamic VRAM (comfy-aimdo's ``ModelPatcherDynamic``),
pinned memory and async offload streams; ``setup`` starts dynamic VRAM with the calls main.py
makes (this harness imports ComfyUI's modules, not its server):

- ``dyn-resident``: no cap (the reference of the dyn rows' ``equal`` column).
- ``dyn-default``: the cap, core's defaults. ``dyn-fast-disk``: the same with ``--fast-disk``.
- ``dyn-ferry-pinned`` / ``dyn-ferry-disk``: Ferry on that core (its non-dynamic delegate).

On a CPU dynamic VRAM stays off (comfy-aimdo initialises CUDA/ROCm devices only): there the dyn
rows run that core's legacy path, and the worker reports which it got.
"""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path
from typing import Any

import torch

from bench.h2h_stubs import stub_if_missing

DYN_ROWS = ("dyn-resident", "dyn-default", "dyn-ferry-pinned", "dyn-fast-disk", "dyn-ferry-disk")
ROWS = (
    *DYN_ROWS,
    "resident",
    "comfy-lowvram",
    "comfy-lowvram-async",
    "ferry-pinned",
    "ferry-ram",
    "ferry-disk",
    "diffusers-block",
    "diffusers-disk",
)
PACK_DIR_NAME = "ComfyUI-Ferry"  # hyphenated, as ComfyUI-Manager names the folder


def setup(comfy_dir: str, device_type: str, row: str) -> dict[str, Any]:
    """Imports ComfyUI with its arguments set as the command line would set them for ``row``;
    returns what the core turned on (dynamic VRAM, pinned-memory limit, offload streams)."""
    sys.path.insert(0, comfy_dir)  # before the repo root: ComfyUI's `nodes`, not the pack's
    for name in ("torchvision", "torchaudio", "av"):  # imported at module level, unused here
        stub_if_missing(name)
    _fake_server()
    import comfy.cli_args

    args = comfy.cli_args.args
    args.cpu = device_type == "cpu"
    if row.startswith("dyn-"):
        args.fast_disk = row == "dyn-fast-disk"  # the current core's defaults otherwise
    else:
        args.async_offload = 2 if row.endswith("-async") else None  # read at import
    dynamic = row.startswith("dyn-") and _aimdo_init()
    import comfy.model_management as mm
    import comfy.sample

    import nodes  # noqa: F401

    if dynamic:
        dynamic = _aimdo_devices(mm)
    return {
        "dynamic_vram": bool(dynamic),
        "pinned_limit": getattr(mm, "MAX_PINNED_MEMORY", None),
        "offload_streams": getattr(mm, "NUM_STREAMS", None),
    }


def _aimdo_init() -> bool:
    """The first half of ComfyUI's dynamic-VRAM start-up (main.py, v0.33): comfy_aimdo's
    library is loaded before any comfy module imports comfy_aimdo (they bind it at import)."""
    import comfy.cli_args

    enables = getattr(comfy.cli_args, "enables_dynamic_vram", None)
    if enables is None or not enables():
        return False  # an older core, or --cpu
    import comfy_aimdo.control

    return bool(
        comfy_aimdo.control.init(nvml_pressure=not comfy.cli_args.args.disable_nvml_pressure)
    )


def _aimdo_devices(mm: Any) -> bool:
    """The second half (main.py): comfy_aimdo takes the devices; core's patcher becomes the
    dynamic one and ``comfy.memory_management.aimdo_enabled`` is set. False where comfy_aimdo
    refuses the device (main.py then keeps the legacy patcher, as this does)."""
    import comfy.memory_management
    import comfy.model_patcher
    import comfy_aimdo.control

    if not comfy_aimdo.control.init_devices(d.index for d in mm.get_all_torch_devices()):
        return False
    comfy.model_patcher.CoreModelPatcher = comfy.model_patcher.ModelPatcherDynamic
    comfy.memory_management.aimdo_enabled = True
    return True


def _fake_server() -> None:
    # The pack registers HTTP routes and pushes stats through PromptServer.instance; there is
    # no server in this process, so give it a route table nobody serves and a silent push.
    from aiohttp import web

    mod = types.ModuleType("server")
    instance = types.SimpleNamespace(routes=web.RouteTableDef(), send_sync=lambda *a, **k: None)
    mod.PromptServer = types.SimpleNamespace(instance=instance)  # type: ignore[attr-defined]
    sys.modules["server"] = mod


def load_pack(repo: Path, scratch: Path) -> str:
    """Loads this repository as ComfyUI loads a custom node pack; returns its module name."""
    import nodes

    link = scratch / "custom_nodes" / PACK_DIR_NAME
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(repo.resolve(), target_is_directory=True)
    ok = asyncio.run(nodes.load_custom_node(str(link)))
    node = nodes.NODE_CLASS_MAPPINGS.get("FerryOffloadModel")
    if not ok or node is None:
        raise RuntimeError(f"ComfyUI did not load the Ferry pack from {link}")
    # ComfyUI names the package after the folder's path; its modules live under that name.
    return str(node.__module__).rsplit(".nodes.", 1)[0]


def load_model(path: str) -> Any:
    import comfy.sd

    return comfy.sd.load_diffusion_model(path)


def lowvram_shim(cap_bytes: int) -> None:
    """CPU dry run only: ComfyUI never partially loads onto a CPU (its load_device is the CPU,
    so VRAMState.DISABLED); pass the cap as lowvram_model_memory so its partial-load path (the
    per-layer weight casting a GPU would use) runs at the tiny size."""
    import comfy.model_management as mm

    orig = mm.LoadedModel.model_load

    def model_load(self: Any, lowvram_model_memory: int = 0, force_patch_weights: bool = False):
        return orig(self, cap_bytes, force_patch_weights=force_patch_weights)

    mm.LoadedModel.model_load = model_load  # type: ignore[method-assign]


def apply_row(row: str, patcher: Any, workdir: Path, ferry_budget: str) -> Any:
    """The MODEL this row samples with."""
    if row in ("resident", "dyn-resident", "dyn-default", "dyn-fast-disk"):
        return patcher
    if row.startswith("comfy-"):
        return patcher
    if "ferry-" in row:
        import nodes

        node = nodes.NODE_CLASS_MAPPINGS["FerryOffloadModel"]
        out = node.execute(
            model=patcher,
            use_panel_settings=False,
            level="block",
            blocks_per_group=1,
            tier=row.rsplit("-", 1)[1],
            disk_path=str(workdir / "ferry"),
            prefetch_depth=2,
            vram_budget=ferry_budget,
        )
        return out.args[0]
    if row.startswith("diffusers-"):
        disk = workdir / "diffusers" if row.endswith("-disk") else None
        return diffusers_patcher(patcher, disk)
    raise ValueError(f"unknown row {row!r}; rows: {', '.join(ROWS)}")


def ferry_stats(pack: str, patcher: Any) -> dict[str, Any] | None:
    """The live offload's counters, read through the pack's own offload_core (the pack is
    imported under its folder name, so its registry is not the top-level package's)."""
    import importlib

    core = importlib.import_module(f"{pack}.offload_core")
    handle = core.find_offload(patcher.model.diffusion_model)
    return None if handle is None else handle.stats().as_dict()


def diffusers_patcher(patcher: Any, disk: Path | None) -> Any:
    """A clone whose load hands the diffusion model to diffusers' group offloading (once) and
    moves only the rest of the BaseModel (sigmas, ...) to the device."""
    base = type(patcher)

    class DiffusersGroupPatcher(base):  # type: ignore[misc, valid-type]
        def _outside(self) -> list[torch.nn.Module]:
            dm = self.model.diffusion_model
            return [m for m in self.model.children() if m is not dm]

        def model_size(self) -> int:
            return sum(
                p.numel() * p.element_size() for m in self._outside() for p in m.parameters()
            )

        def load(self, device_to: Any = None, lowvram_model_memory: int = 0, *a: Any, **k: Any):
            dm = self.model.diffusion_model
            device = device_to if device_to is not None else self.load_device
            _group_once(dm, torch.device(device), disk)
            for m in self._outside():
                m.to(device)
            self.model.device = device
            self.model.model_lowvram = False
            self.model.model_loaded_weight_memory = self.model_size()
            self.model.current_weight_patches_uuid = self.patches_uuid

        def partially_load(self, device_to: Any, extra_memory: int = 0, *a: Any, **k: Any) -> int:
            self.load(device_to)
            return 0

        def partially_unload(self, *a: Any, **k: Any) -> int:
            return 0  # diffusers owns the placement; ComfyUI must not move blocks

        def unpatch_model(self, *a: Any, **k: Any) -> None:
            return None

        def detach(self, unpatch_all: bool = True) -> Any:
            return self.model

    n = patcher.clone()
    n.__class__ = DiffusersGroupPatcher
    return n


def _group_once(dm: torch.nn.Module, device: torch.device, disk: Path | None) -> None:
    """diffusers' block-level group offloading, applied the first time the model loads."""
    from diffusers.hooks import apply_group_offloading

    if getattr(dm, "_h2h_grouped", False):
        return
    stream = device.type == "cuda"
    apply_group_offloading(
        dm, onload_device=device, offload_device=torch.device("cpu"),
        offload_type="block_level", num_blocks_per_group=1, use_stream=stream,
        record_stream=stream, non_blocking=stream,
        offload_to_disk_path=str(disk) if disk is not None else None,
    )  # fmt: skip
    dm._h2h_grouped = True  # type: ignore[assignment]


def conditioning(info: dict[str, Any], seed: int) -> list[Any]:
    """A seeded CONDITIONING shaped for the model (no text encoder: core has no node for it)."""
    g = torch.Generator().manual_seed(seed)
    context = torch.randn(*info["context"], generator=g)
    extra: dict[str, Any] = {"pooled_output": torch.randn(1, info["pooled"], generator=g)}
    if info.get("guidance") is not None:
        extra["guidance"] = info["guidance"]
    return [[context, extra]]


def ksample(model: Any, info: dict[str, Any], steps: int, seed: int) -> torch.Tensor:
    """KSampler as the node runs it: euler / simple, cfg 1 (Flux-dev's guidance is embedded)."""
    import nodes

    cond = conditioning(info, seed)
    latent = {"samples": torch.zeros(*info["latent"])}
    out = nodes.common_ksampler(model, seed, steps, 1.0, "euler", "simple", cond, cond, latent)
    return out[0]["samples"]


def unload_all() -> None:
    import comfy.model_management as mm

    mm.unload_all_models()
