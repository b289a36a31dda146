"""The "Use Ferry's loader" table (nodes/planning/loader_swap.py) against the nodes it names:
Ferry's loaders as their ``define_schema()`` builds them (tests/node_schemas.py) and core
v0.33.0's loaders' widgets and outputs (its nodes.py). Each core value either maps onto a value
Ferry's node offers, or the plan offers no button and says why. The running server's own
/object_info and the swap on the canvas: tests/comfyui/test_comfyui_swap.py."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import pytest

from tests.conftest import PACK_NAME, load_pack
from tests.node_schemas import CORE_CLIP_TYPES, node_schemas

load_pack()
swap_table = importlib.import_module(f"{PACK_NAME}.nodes.planning.loader_swap")
SWAPS, ferry_loader = swap_table.SWAPS, swap_table.ferry_loader
registered_widgets = swap_table.registered_widgets

#: core v0.33.0's loaders (nodes.py): each combo widget's choices (None: a file name) and the
#: kinds of its outputs.
CORE: Mapping[str, tuple[dict[str, list[str] | None], list[str]]] = {
    "UNETLoader": (
        {"unet_name": None,
         "weight_dtype": ["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"]},
        ["MODEL"],
    ),
    "CLIPLoader": (
        {"clip_name": None, "type": CORE_CLIP_TYPES["CLIPLoader"], "device": ["default", "cpu"]},
        ["CLIP"],
    ),
    "DualCLIPLoader": (
        {"clip_name1": None, "clip_name2": None, "type": CORE_CLIP_TYPES["DualCLIPLoader"],
         "device": ["default", "cpu"]},
        ["CLIP"],
    ),
    "CheckpointLoaderSimple": ({"ckpt_name": None}, ["MODEL", "CLIP", "VAE"]),
}  # fmt: skip
OFFLOAD = ["Ferry Offload Model"]


def _accepts(ferry_class: str) -> dict[str, list[Any] | None] | None:
    schema = node_schemas().get(ferry_class)
    if schema is None:
        return None
    return {i["name"]: i.get("options") for i in schema["inputs"]}


def _node(core: str, **values: Any) -> dict[str, Any]:
    widgets = CORE[core][0]
    inputs = {w: (c[0] if c else "model.safetensors") for w, c in widgets.items()}
    return {"class_type": core, "inputs": {**inputs, **values}}


def test_the_table_covers_core_loaders_and_their_every_widget() -> None:
    assert set(SWAPS) == set(CORE)
    for core, swap in SWAPS.items():
        assert sorted(swap.widgets.values()) == sorted(CORE[core][0]), core


@pytest.mark.parametrize("core", sorted(CORE))
def test_each_swap_names_widgets_and_outputs_its_ferry_node_has(core: str) -> None:
    swap = SWAPS[core]
    schema = node_schemas().get(swap.ferry)
    if schema is None:
        pytest.skip(f"{swap.ferry} is not in this checkout")
    inputs = {i["name"]: i for i in schema["inputs"]}
    assert set(swap.widgets) | set(swap.fixed) <= set(inputs), core
    unset = [n for n, i in inputs.items() if n not in swap.widgets and n not in swap.fixed]
    # What the table leaves out keeps its default: a widget with none would have no value.
    assert all("default" in inputs[n] or inputs[n]["optional"] for n in unset), unset
    for name, value in swap.fixed.items():
        assert value in inputs[name]["options"], (core, name)
    ferry_kinds = [o["kind"] for o in schema["outputs"]]
    assert [CORE[core][1][i] for i in swap.outputs] == ferry_kinds, core
    for ferry_w, core_w in swap.widgets.items():  # a file list reads the same folder
        assert ("files" in inputs[ferry_w]) == (CORE[core][0][core_w] is None), (core, ferry_w)


def test_the_plans_sentences_name_ferrys_loaders_as_the_canvas_titles_them() -> None:
    schemas = node_schemas()
    shipped = [s.ferry for s in SWAPS.values() if s.ferry in schemas]
    assert len(shipped) >= 3
    for ferry in shipped:
        assert swap_table.TITLES[ferry] == schemas[ferry]["display_name"], ferry


@pytest.mark.parametrize("core", ["UNETLoader", "CLIPLoader", "DualCLIPLoader"])
def test_each_core_value_is_offered_exactly_where_ferrys_node_offers_it(core: str) -> None:
    swap = SWAPS[core]
    accepted = _accepts(swap.ferry)
    assert accepted is not None
    for core_w, choices in CORE[core][0].items():
        ferry_w = next(f for f, c in swap.widgets.items() if c == core_w)
        for value in choices or ():
            entry = ferry_loader("7", _node(core, **{core_w: value}), OFFLOAD, _accepts)
            assert entry is not None
            offered = entry["ferry_class"] == swap.ferry
            assert offered == (value in (accepted[ferry_w] or [value])), (core, core_w, value)
            if not offered:
                assert repr(value) in entry["why"] and core_w in entry["why"], entry


def test_unetloader_offers_ferrys_loader_with_its_mapping() -> None:
    node = _node("UNETLoader", unet_name="flux1-dev.safetensors", weight_dtype="fp8_e4m3fn")
    entry = ferry_loader("12", node, OFFLOAD, _accepts)
    assert entry == {
        "node_id": "12", "class_type": "UNETLoader",
        "ferry_class": "FerryLoadDiffusionModelQuantized",
        "widgets": {"unet_name": "unet_name", "weight_dtype": "weight_dtype"},
        "fixed": {"quant_preset": "none"}, "outputs": [0],
        "why": "UNETLoader holds the whole network in RAM before Ferry Offload Model runs; "
        "Ferry Load Diffusion Model (quantized) leaves the weights in the file until Ferry "
        "Offload Model lays them out",
    }  # fmt: skip


def test_the_fast_fp8_kernel_has_no_equivalent_and_the_plan_says_so() -> None:
    entry = ferry_loader(
        "3", _node("UNETLoader", weight_dtype="fp8_e4m3fn_fast"), OFFLOAD, _accepts
    )
    assert entry is not None and entry["ferry_class"] is None
    assert entry["why"] == (
        "UNETLoader's weight_dtype 'fp8_e4m3fn_fast' has no equivalent in "
        "Ferry Load Diffusion Model (quantized)"
    )


def test_a_widget_driven_by_a_link_is_kept_not_checked() -> None:
    entry = ferry_loader("3", _node("CLIPLoader", type=["9", 0]), OFFLOAD, _accepts)
    assert entry is not None and entry["ferry_class"] == "FerryLoadTextEncoder"


def test_no_button_without_a_ferry_offload_node_after_the_loader() -> None:
    entry = ferry_loader("3", _node("DualCLIPLoader"), [], _accepts)
    assert entry is not None and entry["ferry_class"] is None
    assert entry["why"].startswith("no Ferry offload node takes its output"), entry


def test_no_button_where_core_leaves_the_weights_in_the_files_mapping() -> None:
    entry = ferry_loader("3", _node("CLIPLoader"), ["Ferry Offload Text Encoder"], _accepts, False)
    assert entry is not None and entry["ferry_class"] is None
    assert entry["why"] == (
        "CLIPLoader leaves the weights in the file's mapping on this ComfyUI (no copy in RAM), "
        "so Ferry Load Text Encoder would not lower the peak"
    )


def test_no_button_where_the_server_does_not_register_ferrys_node() -> None:
    entry = ferry_loader("5", _node("CheckpointLoaderSimple"), OFFLOAD, lambda cls: None)
    assert entry is not None and entry["ferry_class"] is None
    assert entry["why"] == "this ComfyUI has no FerryLoadCheckpoint node (update ComfyUI-Ferry)"


def test_loaders_without_a_ferry_equivalent_get_no_entry() -> None:
    for cls in ("FerryLoadDiffusionModelQuantized", "VAELoader", "UnetLoaderGGUF"):
        assert ferry_loader("1", {"class_type": cls, "inputs": {}}, OFFLOAD, _accepts) is None


def test_registered_widgets_reads_both_forms_core_writes_a_combo_in() -> None:
    got = registered_widgets(
        {
            "required": {"a": (["x", "y"],), "b": ("COMBO", {"options": ["z"]}), "n": ("INT", {})},
            "optional": {"d": (["default", "cpu"], {"advanced": True})},
        }
    )
    assert got == {"a": ["x", "y"], "b": ["z"], "n": None, "d": ["default", "cpu"]}
