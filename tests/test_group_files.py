"""The pre-flight and the run agree on the disk tier's group files (issue 47): one answer
(offload_core/planner/group_files.py, with nodes/planning/group_source.py for the file) says
whether a network's groups are read in place from the file its loader read or written, and
how many bytes. Found in real ComfyUI v0.33.0: UNETLoader -> Ferry Offload Model on the disk
tier was planned "disk 0 B" and the run then asked for room for every group."""

from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from offload_core import BlockLevel, DiskTier, OffloadPolicy
from offload_core.model.plan import plan_offload
from offload_core.planner.group_files import group_files, plan_group_files
from tests.conftest import PACK_NAME, load_pack
from tests.helpers import make_model

load_pack()
pn = importlib.import_module(f"{PACK_NAME}.nodes.planning.prompt_networks")
gs = importlib.import_module(f"{PACK_NAME}.nodes.planning.group_source")
config = importlib.import_module(f"{PACK_NAME}.nodes.planning.config")

FERRY_WIDGETS = {
    "use_panel_settings": False, "level": "block", "blocks_per_group": "auto", "tier": "disk",
    "disk_path": "", "prefetch_depth": "auto", "vram_budget": "auto",
}  # fmt: skip


def test_groups_are_written_without_a_source_or_where_the_host_changed_them() -> None:
    assert group_files(None, [(10, True), (5, True)]).written == 15
    mixed = group_files("m.safetensors", [(10, True), (5, False)])
    assert (mixed.read_in_place, mixed.written, mixed.in_place) == (10, 5, False)
    assert group_files("m.safetensors", [(10, True)]).in_place


def unet_prompt(**loader: Any) -> dict[str, Any]:
    return {
        "1": {"class_type": "UNETLoader",
              "inputs": {"unet_name": "m.safetensors", "weight_dtype": "default", **loader}},
        "2": {"class_type": "FerryOffloadModel", "inputs": {"model": ["1", 0], **FERRY_WIDGETS}},
        "3": {"class_type": "KSampler", "inputs": {"model": ["2", 0], "steps": 4, "cfg": 1.0}},
    }  # fmt: skip


def with_lora(prompt: dict[str, Any]) -> dict[str, Any]:
    prompt["4"] = {"class_type": "LoraLoaderModelOnly",
                   "inputs": {"model": ["1", 0], "lora_name": "l.safetensors"}}  # fmt: skip
    prompt["2"]["inputs"]["model"] = ["4", 0]
    return prompt


def model_file(tmp_path: Path, dtype: str) -> tuple[torch.nn.Module, Path]:
    model = make_model(dtype)
    path = tmp_path / "m.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model, path


def planned(tmp_path: Path, prompt: dict[str, Any], cast: torch.dtype | None) -> Any:
    """The pre-flight's figures for the prompt's network (the host casts floats to ``cast``)."""

    def find(folder: str, name: str) -> str | None:
        p = tmp_path / name
        return str(p) if p.is_file() else None

    (net,) = pn.prompt_networks(prompt, find, lambda kind: cast)
    return net.facts


def run_writes(tmp_path: Path, prompt: dict[str, Any], model: torch.nn.Module) -> int:
    """What the run's check counts for the node "2" (offload_node.py's ``loaded_from`` finds
    the file, offload_policy.py's check counts the bytes)."""

    def find(folder: str, name: str) -> str | None:
        return str(tmp_path / name) if folder == "diffusion_models" else None

    source = gs.core_loader_file(prompt, "2", "model", find, pn.LOADERS)
    tier = DiskTier(str(tmp_path / "ferry"), source_checkpoint=source)
    plan = plan_offload(model, OffloadPolicy(level=BlockLevel(1), tier=tier), onload_device="cpu")
    return plan_group_files(plan).written


@pytest.mark.parametrize(
    ("case", "stored", "held", "lora", "in_place"),
    [
        ("as stored", "fp32", torch.float32, False, True),
        ("cast by the host", "bf16", torch.float32, False, False),
        ("a LoRA on the way", "fp32", torch.float32, True, False),
    ],
)
def test_unetloader_planned_as_the_run_counts(
    tmp_path: Path, case: str, stored: str, held: torch.dtype, lora: bool, in_place: bool
) -> None:
    model, _ = model_file(tmp_path, stored)
    prompt = with_lora(unet_prompt()) if lora else unet_prompt()
    facts = planned(tmp_path, prompt, held)
    assert facts.in_place == in_place, case
    written = run_writes(tmp_path, prompt, model.to(held))
    offloaded = plan_offload(model, OffloadPolicy(level=BlockLevel(1)), onload_device="cpu")
    assert (written == 0) == facts.in_place, (case, written)
    if not in_place:
        assert written == offloaded.offloaded_bytes  # every streamed group is written


def test_a_cast_loader_and_a_core_loader_ferry_cannot_read_from_are_written(
    tmp_path: Path,
) -> None:
    model_file(tmp_path, "fp32")
    cast = unet_prompt(weight_dtype="fp8_e4m3fn")
    assert not planned(tmp_path, cast, None).in_place
    assert (
        gs.core_loader_file(cast, "2", "model", lambda f, n: str(tmp_path / n), pn.LOADERS) is None
    )
    # A model patch through core's loader: the run has no file to read it from (nothing
    # finds one for ModelPatchLoader), so the pre-flight counts its bytes as written.
    patch = {
        "1": {"class_type": "ModelPatchLoader", "inputs": {"name": "m.safetensors"}},
        "2": {"class_type": "FerryOffloadModelPatch",
              "inputs": {"model_patch": ["1", 0], **FERRY_WIDGETS}},
    }  # fmt: skip
    assert not planned(tmp_path, patch, None).in_place


def test_ferrys_own_loader_keeps_its_file(tmp_path: Path) -> None:
    model_file(tmp_path, "fp32")
    prompt = unet_prompt()
    prompt["1"] = {"class_type": "FerryLoadDiffusionModelQuantized",
                   "inputs": {"unet_name": "m.safetensors", "quant_preset": "none"}}  # fmt: skip
    assert planned(tmp_path, prompt, None).in_place
    assert not planned(tmp_path, with_lora(prompt), None).in_place


def test_a_folder_needs_room_only_for_what_is_written(tmp_path: Path) -> None:
    """The run's folder checks and the planner's take one rule: group files and the margin,
    none where nothing is written (a 1 MiB folder serves a network read in place)."""
    from offload_core.disk.folder import SPACE_MARGIN, check_disk_folder, room_needed
    from offload_core.planner import MachineFacts, NetworkFacts
    from offload_core.planner.tiers import disk_takes

    assert room_needed(0) == 0 and room_needed(1) == 1 + SPACE_MARGIN
    assert check_disk_folder(str(tmp_path), 0).ok
    machine = MachineFacts(vram_free=None, ram_available=1 << 30, disk_free=1 << 20)
    net = NetworkFacts("m", "model", 10 << 20)
    assert disk_takes([replace(net, in_place=True)], machine)
    assert not disk_takes([net], machine)
    assert not disk_takes([replace(net, nbytes=1 << 19)], machine)  # fits, not its margin
