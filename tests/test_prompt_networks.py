"""The networks of a queued prompt (nodes/planning/prompt_networks.py) read from the prompt and the
files' headers alone, planned together (the pre-flight's and the "auto" widgets' path)."""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PACK_NAME, load_pack

from .planner_files import bytes_read, dit_tensors, sparse_safetensors

load_pack()
pn = importlib.import_module(f"{PACK_NAME}.nodes.planning.prompt_networks")
config = importlib.import_module(f"{PACK_NAME}.nodes.planning.config")
api = importlib.import_module(f"{PACK_NAME}.nodes.ui.api")
planner = importlib.import_module(f"{PACK_NAME}.offload_core.planner")
errors = importlib.import_module(f"{PACK_NAME}.offload_core.errors")
GIB = 1 << 30


def te_tensors(layers: int, width: int, key: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    out = {f"{key}.embed.weight": ("F16", (32000, width))}
    for i in range(layers):
        out[f"{key}.layers.{i}.attn.weight"] = ("F16", (width, width))
        out[f"{key}.layers.{i}.mlp.weight"] = ("F16", (4 * width, width))
    return out


def ferry(kind: str, link: list[Any], **widgets: Any) -> dict[str, Any]:
    inputs = {
        "use_panel_settings": False, "level": "block", "blocks_per_group": "auto",
        "tier": "auto", "disk_path": "", "prefetch_depth": "auto", "vram_budget": "auto",
        **widgets,
    }  # fmt: skip
    key = "model" if kind == "FerryOffloadModel" else "clip"
    return {"class_type": kind, "inputs": {key: link, **inputs}}


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """Four networks' files, 38 GiB declared, holes on disk."""
    sparse_safetensors(tmp_path / "high.safetensors", dit_tensors(40, 5120))  # ~16 GiB bf16
    sparse_safetensors(tmp_path / "low.safetensors", dit_tensors(40, 5120))
    sparse_safetensors(tmp_path / "umt5.safetensors", te_tensors(24, 4096, "encoder"))
    sparse_safetensors(tmp_path / "clip_l.safetensors", te_tensors(12, 768, "text_model"))
    sparse_safetensors(tmp_path / "clip_g.safetensors", te_tensors(32, 1280, "text_model"))
    sparse_safetensors(
        tmp_path / "vae.safetensors", {"decoder.conv_in.weight": ("F16", (512, 16, 3, 3))}
    )
    return tmp_path


def four_networks() -> dict[str, Any]:
    """Two experts (one behind Ferry, one plain), a text encoder behind Ferry through a
    pass-through node, and a dual text encoder with no Ferry node."""
    return {
        "1": {"class_type": "FerryLoadDiffusionModelQuantized",
              "inputs": {"unet_name": "high.safetensors", "quant_preset": "none", "cache": True}},
        "2": ferry("FerryOffloadModel", ["1", 0]),
        "3": {"class_type": "UNETLoader", "inputs": {"unet_name": "low.safetensors",
                                                      "weight_dtype": "default"}},
        "4": {"class_type": "FerryLoadTextEncoder", "inputs": {"clip_name": "umt5.safetensors",
                                                                "type": "wan"}},
        "5": {"class_type": "CLIPSetLastLayer", "inputs": {"clip": ["4", 0],
                                                            "stop_at_clip_layer": -1}},
        "6": ferry("FerryOffloadTextEncoder", ["5", 0], tier="disk", prefetch_depth="2"),
        "7": {"class_type": "DualCLIPLoader", "inputs": {
            "clip_name1": "clip_l.safetensors", "clip_name2": "clip_g.safetensors", "type": "sdxl"}},
        "8": {"class_type": "KSampler", "inputs": {"model": ["2", 0], "steps": 12, "cfg": 5.0}},
        "9": {"class_type": "KSamplerAdvanced", "inputs": {"model": ["3", 0], "steps": 8,
                                                            "cfg": 1.0}},
        "10": {"class_type": "VAELoader", "inputs": {"vae_name": "vae.safetensors"}},
    }  # fmt: skip


def networks(files: Path, prompt: dict[str, Any]) -> list[Any]:
    def find(folder: str, name: str) -> str | None:
        p = files / name
        return str(p) if p.is_file() else None

    # Each network with its Ferry node's widgets parsed into its wish, as graph_plan.py's
    # plan_prompt attaches them (prompt_networks says which node offloads which network).
    return [
        dataclasses.replace(n, facts=dataclasses.replace(n.facts, wish=config.NodeSettings.parse(
            prompt[n.ferry_id]["inputs"]).wish)) if n.ferry_id else n
        for n in pn.prompt_networks(prompt, find, lambda kind: None)
    ]  # fmt: skip


def test_four_networks_read_from_the_prompt_and_headers(files: Path) -> None:
    nets = networks(files, four_networks())
    by_loader = {n.loader_id: n for n in nets}
    assert [n.loader_id for n in nets] == ["1", "3", "4", "7", "10"]  # models, encoders, VAE
    assert by_loader["10"].facts.kind == "vae" and not by_loader["10"].facts.ferry
    assert by_loader["1"].ferry_id == "2" and by_loader["4"].ferry_id == "6"
    assert by_loader["3"].ferry_id is None and not by_loader["3"].facts.ferry
    assert by_loader["7"].ferry_id is None
    high = by_loader["1"].facts
    assert high.reads_per_prompt == 24.0  # 12 steps x 2 (cfg 5), the largest sampler's
    assert by_loader["4"].facts.reads_per_prompt == 1.0
    assert len(high.block_bytes) == 40 and high.nbytes > 15 * GIB and high.in_place
    dual = by_loader["7"].facts
    assert dual.name == "clip_l + clip_g" and dual.longest_list == 32
    assert len(dual.block_bytes) == 44 and by_loader["7"].files == (
        str(files / "clip_l.safetensors"),
        str(files / "clip_g.safetensors"),
    )
    assert by_loader["4"].facts.wish == planner.Wish(tier="disk", prefetch_depth=2)
    assert high.wish == planner.Wish()


def test_four_network_plan_reads_headers_only_and_answers_in_under_a_second(files: Path) -> None:
    machine = planner.MachineFacts(
        vram_free=None, ram_available=30 * GIB, disk_free=500 * GIB, disk_folder=str(files)
    )
    start = time.perf_counter()
    with bytes_read() as n:
        nets = networks(files, four_networks())
        plan = planner.plan_graph(machine, [x.facts for x in nets])
    took = time.perf_counter() - start
    assert took < 1.0, f"the pre-flight took {took:.2f} s"
    assert n[0] < 6 * 64 * 1024, f"read {n[0]} bytes: more than six headers"
    assert plan.fits, plan.verdict()
    tiers = {c.network.name: c.tier for c in plan.choices}
    # 28 GiB of room: the plain expert (15.6 GiB) and CLIP stay in RAM (not Ferry's), the
    # text encoder was set to disk, and the Ferry expert (15.6 GiB) does not fit beside them.
    assert tiers == {
        "high": "disk", "low": "ram", "umt5": "disk", "clip_l + clip_g": "ram", "vae": "ram"
    }  # fmt: skip


def test_a_missing_file_names_its_widget(files: Path) -> None:
    prompt = four_networks()
    prompt["4"]["inputs"]["clip_name"] = "gone.safetensors"
    with pytest.raises(errors.ConfigError) as e:
        networks(files, prompt)
    assert e.value.setting == "clip_name" and "gone.safetensors" in str(e.value)


def test_a_bad_widget_names_it(files: Path) -> None:
    prompt = four_networks()
    prompt["6"]["inputs"]["prefetch_depth"] = "9"
    with pytest.raises(config.NodeInputError) as e:
        networks(files, prompt)
    assert e.value.input_name == "prefetch_depth"


@pytest.mark.parametrize(
    ("widgets", "wish"),
    [
        ({}, planner.Wish()),
        ({"tier": "auto", "blocks_per_group": " Auto ", "prefetch_depth": "auto"}, planner.Wish()),
        ({"tier": "ram", "blocks_per_group": 2, "prefetch_depth": "3"},
         planner.Wish("ram", 2, 3)),
        ({"blocks_per_group": "2.0"}, None),
        ({"tier": "fast"}, None),
    ],
)  # fmt: skip
def test_node_settings_parse_the_wish(widgets: dict[str, Any], wish: Any) -> None:
    if wish is None:
        with pytest.raises(config.NodeInputError) as e:
            config.NodeSettings.parse(widgets)
        assert e.value.input_name in widgets
    else:
        assert config.NodeSettings.parse(widgets).wish == wish


def test_the_choice_fills_only_auto_as_a_typed_value() -> None:
    widgets = {"tier": "auto", "blocks_per_group": "auto", "prefetch_depth": 3, "level": "block",
               "disk_path": "", "vram_budget": ""}  # fmt: skip
    settings = config.NodeSettings.parse(widgets)
    net = planner.NetworkFacts("m", "model", GIB, (GIB // 8,) * 8, wish=settings.wish)
    machine = planner.MachineFacts(vram_free=None, ram_available=64 * GIB)
    choice = planner.plan_graph(machine, [net]).choices[0]
    assert choice.prefetch_depth == 3  # the user's, honoured by the planner
    policy = settings.policy(choice, "/tmp")
    assert policy.tier_name == "ram" and policy.prefetch_depth == 3
    assert policy.level.blocks_per_group == choice.blocks_per_group
    assert policy.vram_budget is None and policy.planned_vram is None  # empty: the user's
    with pytest.raises(config.NodeInputError) as e:
        settings.policy(None, "/tmp")  # "auto" without the planner's choice
    assert e.value.input_name == "tier"


def test_saved_numbers_still_load_as_text() -> None:
    # ComfyUI hands a workflow's saved 2 to the (now text) widget as "2".
    policy = config.policy_from_inputs(
        level="block", blocks_per_group="2", tier="ram", disk_path="", prefetch_depth="1",
        vram_budget="",
    )  # fmt: skip
    assert policy.to_dict()["blocks_per_group"] == 2 and policy.prefetch_depth == 1


def test_a_loaders_weight_dtype_is_how_it_loads(files: Path) -> None:
    prompt = four_networks()
    prompt["3"]["inputs"]["weight_dtype"] = "fp8_e4m3fn"
    low = next(n for n in networks(files, prompt) if n.loader_id == "3").facts
    high = next(n for n in networks(files, prompt) if n.loader_id == "1").facts
    assert not low.in_place and high.in_place  # converted: the disk tier must write it
    assert low.nbytes < high.nbytes * 0.6  # 8-bit weights, float32 norms


def test_the_samplers_steps_are_the_most_read_samplers() -> None:
    assert pn.sampler_steps(four_networks()) == 12  # 12 x 2 (cfg 5) beats 8 x 1
    assert pn.sampler_steps({"1": {"class_type": "VAELoader", "inputs": {}}}) is None


def test_ferrys_quantizing_loader_is_planned_at_its_presets_bytes(files: Path) -> None:
    prompt = four_networks()
    plain = next(n for n in networks(files, prompt) if n.loader_id == "1").facts
    prompt["1"]["inputs"]["quant_preset"] = "int8-weight"
    high = next(n for n in networks(files, prompt) if n.loader_id == "1").facts
    assert not high.in_place  # quantized on the way: the disk tier writes its groups
    assert 0.45 < high.nbytes / plain.nbytes < 0.55  # bf16 blocks' Linears in int8
    assert high.transient_bytes == 4 * 5120 * 5120 * 2  # one Linear dequantized (bf16)


@pytest.mark.parametrize("loader", ["CheckpointLoaderSimple", "FerryLoadCheckpoint"])
@pytest.mark.parametrize("te_prefix", ["conditioner.embedders.", "cond_stage_model."])
def test_a_checkpoint_is_three_networks(files: Path, te_prefix: str, loader: str) -> None:
    tensors = {
        **dit_tensors(6, 256, prefix="model.diffusion_model."),
        **te_tensors(4, 64, f"{te_prefix}0.transformer.text_model.encoder"),
        "first_stage_model.decoder.conv_in.weight": ("F32", (128, 4, 3, 3)),
    }
    sparse_safetensors(files / "sdxl.safetensors", tensors)
    prompt = {
        "1": {"class_type": loader, "inputs": {"ckpt_name": "sdxl.safetensors"}},
        "2": ferry("FerryOffloadModel", ["1", 0]),
        "3": ferry("FerryOffloadTextEncoder", ["1", 1], tier="ram"),
        "4": {"class_type": "KSampler", "inputs": {"model": ["2", 0], "steps": 5, "cfg": 7.0}},
    }
    nets = {n.facts.kind: n for n in networks(files, prompt)}
    assert set(nets) == {"model", "text_encoder", "vae"}
    assert (nets["model"].ferry_id, nets["text_encoder"].ferry_id, nets["vae"].ferry_id) == (
        "2", "3", None,
    )  # fmt: skip
    assert len(nets["model"].facts.block_bytes) == 6 and nets["model"].facts.reads_per_prompt == 10
    assert len(nets["text_encoder"].facts.block_bytes) == 4
    assert nets["text_encoder"].facts.wish == planner.Wish(tier="ram")
    assert nets["vae"].facts.nbytes == 128 * 4 * 9 * 4
    total = sum(n.facts.nbytes for n in nets.values())
    assert total == sum(  # every tensor of the file in exactly one network
        4 * math.prod(shape) if dtype == "F32" else 2 * math.prod(shape)
        for dtype, shape in tensors.values()
    )


def control_tensors(blocks: int, width: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """A Flux-shaped ControlNet: its own double blocks beside zero-initialized outputs (a
    list of Linears, twice as long), and an input-hint Sequential of convs."""
    out = {"img_in.weight": ("BF16", (width, 64))}
    for i in range(0, 16, 2):
        out[f"input_hint_block.{i}.weight"] = ("BF16", (16, 16, 3, 3))
    for i in range(2 * blocks):
        out[f"controlnet_single_blocks.{i}.weight"] = ("BF16", (width, width))
    for i in range(blocks):
        out[f"double_blocks.{i}.img_mlp.0.weight"] = ("BF16", (4 * width, width))
        out[f"controlnet_blocks.{i}.weight"] = ("BF16", (width, width))
    return out


def side_networks(files: Path) -> dict[str, Any]:
    """A model with a ControlNet behind Ferry, a second one (DiffControlNetLoader) plain, a
    model patch and a CLIP vision model behind Ferry."""
    sparse_safetensors(files / "union.safetensors", control_tensors(4, 256))
    sparse_safetensors(files / "diff_cn.safetensors", control_tensors(2, 128))
    sparse_safetensors(files / "qwen_patch.safetensors", dit_tensors(5, 256, dtype="F16"))
    sparse_safetensors(files / "clip_vision_h.safetensors", te_tensors(6, 128, "visual"))

    def offload(kind: str, key: str, link: list[Any], **widgets: Any) -> dict[str, Any]:
        node = ferry(kind, link, **widgets)
        node["inputs"][key] = node["inputs"].pop("clip")
        return node

    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "high.safetensors",
                                                      "weight_dtype": "default"}},
        "2": {"class_type": "ControlNetLoader", "inputs": {"control_net_name": "union.safetensors"}},
        "3": offload("FerryOffloadControlNet", "control_net", ["2", 0], tier="ram"),
        "4": {"class_type": "DiffControlNetLoader", "inputs": {
            "model": ["1", 0], "control_net_name": "diff_cn.safetensors"}},
        "5": {"class_type": "ModelPatchLoader", "inputs": {"name": "qwen_patch.safetensors"}},
        "6": offload("FerryOffloadModelPatch", "model_patch", ["5", 0], blocks_per_group="2"),
        "7": {"class_type": "CLIPVisionLoader", "inputs": {"clip_name": "clip_vision_h.safetensors"}},
        "8": offload("FerryOffloadClipVision", "clip_vision", ["7", 0], tier="disk"),
        "9": {"class_type": "ControlNetApplyAdvanced", "inputs": {"control_net": ["3", 0]}},
        "10": {"class_type": "KSampler", "inputs": {"model": ["1", 0], "steps": 6, "cfg": 4.0}},
    }  # fmt: skip


def test_controlnets_model_patches_and_clip_vision_are_the_prompts_networks(files: Path) -> None:
    nets = networks(files, side_networks(files))
    by_loader = {n.loader_id: n for n in nets}
    assert [n.loader_id for n in nets] == ["1", "2", "4", "5", "7"]  # per-step kinds first
    kinds = {i: n.facts.kind for i, n in by_loader.items()}
    assert kinds == {"1": "model", "2": "controlnet", "4": "controlnet", "5": "model_patch",
                     "7": "clip_vision"}  # fmt: skip
    ferry_of = {i: n.ferry_id for i, n in by_loader.items()}
    assert ferry_of == {"1": None, "2": "3", "4": None, "5": "6", "7": "8"}
    assert [by_loader[i].facts.ferry for i in ("2", "4", "5", "7")] == [True, False, True, True]
    # The sampler runs a ControlNet and a model patch at every step, as the model; an image
    # is encoded once a prompt.
    reads = {i: n.facts.reads_per_prompt for i, n in by_loader.items()}
    assert reads == {"1": 12.0, "2": 12.0, "4": 12.0, "5": 12.0, "7": 1.0}
    # The double blocks are its block list; controlnet_blocks is a list of Linears, which
    # grouping does not cut into groups: counted, the plan could ask for 8 blocks a group.
    assert len(by_loader["2"].facts.block_bytes) == 4
    assert by_loader["2"].facts.longest_list == 4
    assert len(by_loader["5"].facts.block_bytes) == 5
    # Core's ModelPatchLoader keeps no file Ferry's run reads from: the disk tier writes it
    # (planner/group_files.py), and the pre-flight counts those bytes.
    assert not by_loader["5"].facts.in_place
    # Core's ControlNetLoader's file is read in place by the run (loader_files.py), so the
    # pre-flight counts no group file for it (group_source.py's CORE_IN_PLACE).
    assert by_loader["2"].facts.in_place and by_loader["2"].as_stored
    assert len(by_loader["7"].facts.block_bytes) == 6
    assert by_loader["2"].files == (str(files / "union.safetensors"),)
    assert by_loader["2"].facts.wish == planner.Wish(tier="ram")
    assert by_loader["5"].facts.wish == planner.Wish(blocks_per_group=2)
    assert by_loader["7"].facts.wish == planner.Wish(tier="disk")


def test_a_missing_controlnet_file_names_its_widget(files: Path) -> None:
    prompt = side_networks(files)
    prompt["2"]["inputs"]["control_net_name"] = "gone.safetensors"
    with pytest.raises(errors.ConfigError) as e:
        networks(files, prompt)
    assert e.value.setting == "control_net_name" and "models/controlnet" in str(e.value)


def test_the_plan_gives_each_new_kinds_ferry_node_its_choice(files: Path) -> None:
    machine = planner.MachineFacts(
        vram_free=None, ram_available=64 * GIB, disk_free=500 * GIB, disk_folder=str(files)
    )
    nets = networks(files, side_networks(files))
    plan = planner.plan_graph(machine, [n.facts for n in nets])
    choice = {n.ferry_id: c for n, c in zip(nets, plan.choices) if n.ferry_id}
    assert set(choice) == {"3", "6", "8"}
    assert choice["3"].tier == "ram" and choice["8"].tier == "disk"
    assert choice["6"].blocks_per_group == 2


def test_every_offload_nodes_site_is_a_ferry_node_of_the_planner() -> None:
    # Each node file names its NODE_ID and its SITE (seam/site.py): the planner must find
    # that node's network on the site's control, as the site's kind.
    site = importlib.import_module(f"{PACK_NAME}.seam.site")
    found = {}
    for path in Path(pn.__file__).parents[1].glob("*_node.py"):
        text = path.read_text()
        node_id = re.search(r'^NODE_ID = "(\w+)"', text, re.M)
        site_name = re.search(r"^    SITE = (\w+)$", text, re.M)
        if node_id and site_name:
            s = getattr(site, site_name.group(1))
            found[node_id.group(1)] = (s.control, s.planner_kind)
    assert len(found) == len(site.SITES)
    assert found == dict(pn.FERRY_NODES)
