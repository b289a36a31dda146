"""Which file the core loader before a Ferry node read (nodes/planning/loader_files.py): by the
prompt's loader inputs, through LoRA loaders; none where the loader casts or is not core's."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from tests.conftest import PACK_NAME, load_pack

load_pack()
loader_files = importlib.import_module(f"{PACK_NAME}.nodes.planning.loader_files").loader_files


def find(folder: str, name: str) -> str | None:
    return None if name == "gone.safetensors" else f"/models/{folder}/{name}"


def prompt(loader: str, inputs: dict[str, Any], key: str = "model", lora: bool = False) -> dict:
    g: dict[str, Any] = {"1": {"class_type": loader, "inputs": inputs}}
    link = ["1", 0]
    if lora:
        g["2"] = {"class_type": "LoraLoader", "inputs": {"model": link, "clip": link}}
        link = ["2", 0]
    g["9"] = {"class_type": "FerryOffloadModel", "inputs": {key: link}}
    return g


def test_unet_loaders_file() -> None:
    g = prompt("UNETLoader", {"unet_name": "m.safetensors", "weight_dtype": "default"})
    assert loader_files(g, "9", "model", find) == ("/models/diffusion_models/m.safetensors",)


def test_through_a_lora_loader() -> None:
    g = prompt("CLIPLoader", {"clip_name": "t5.safetensors", "type": "sd3"}, "clip", lora=True)
    assert loader_files(g, "9", "clip", find) == ("/models/text_encoders/t5.safetensors",)


def test_both_files_of_a_dual_clip_loader() -> None:
    g = prompt(
        "DualCLIPLoader",
        {"clip_name1": "l.safetensors", "clip_name2": "t5.safetensors", "type": "flux"},
        "clip",
    )
    assert loader_files(g, "9", "clip", find) == (
        "/models/text_encoders/l.safetensors",
        "/models/text_encoders/t5.safetensors",
    )


@pytest.mark.parametrize(
    ("loader", "inputs"),
    [
        ("UNETLoader", {"unet_name": "m.safetensors", "weight_dtype": "fp8_e4m3fn"}),  # a cast
        ("UNETLoader", {"unet_name": "gone.safetensors", "weight_dtype": "default"}),
        ("UNETLoader", {"unet_name": ["5", 0], "weight_dtype": "default"}),  # a linked name
        ("FerryLoadDiffusionModelQuantized", {"unet_name": "m.safetensors"}),  # Ferry's own
        ("CheckpointLoaderSimple", {"ckpt_name": "c.safetensors"}),
    ],
)
def test_no_file_where_it_is_not_a_core_loaders_as_stored(
    loader: str, inputs: dict[str, Any]
) -> None:
    assert loader_files(prompt(loader, inputs), "9", "model", find) == ()


def test_no_prompt_or_no_node() -> None:
    assert loader_files(None, "9", "model", find) == ()
    assert loader_files({}, "9", "model", find) == ()


copy_note = importlib.import_module(f"{PACK_NAME}.nodes.planning.loader_files").copy_note


def test_the_copy_note_gives_the_loaders_peak_and_ferrys_loader() -> None:
    note = copy_note("UNETLoader", ("/m/dit.safetensors",), 3 << 30, 3 << 30)
    assert note.startswith("UNETLoader reads dit.safetensors whole into RAM before Ferry runs")
    assert "about 6.00 GiB at its peak" in note, note
    assert "use Ferry Load Diffusion Model (quantized) with quant_preset none instead" in note
    dual = copy_note("DualCLIPLoader", ("/t/l.safetensors", "/t/t5.safetensors"), 1, 1)
    assert "l.safetensors + t5.safetensors" in dual and "Ferry Load Text Encoders (dual)" in dual
