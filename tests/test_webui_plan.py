"""The "Ferry offload" accordion's Plan button (webui/plan.py, its button in webui/script.py,
``GET /ferry/plan`` in webui/routes.py) on stand-in checkpoints (tests/webui_standins.py):
the planner's choice for the UNet and the text encoder, nothing loaded or moved."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import test_webui_forge as unet_tests
from tests import webui_standins as forge
from tests.conftest import PACK_NAME, load_pack

load_pack()
plan_mod = importlib.import_module(f"{PACK_NAME}.webui.plan")
layout_mod = importlib.import_module(f"{PACK_NAME}.webui.live_layout")
script_mod = importlib.import_module(f"{PACK_NAME}.webui.script")
routes = importlib.import_module(f"{PACK_NAME}.webui.routes")
planner = importlib.import_module(f"{PACK_NAME}.offload_core.planner")
network_module = importlib.import_module(f"{PACK_NAME}.offload_core.planner.network_module")
units = importlib.import_module(f"{PACK_NAME}.offload_core.units")

#: The Forge host's fixture (its default disk folder and settings file under tmp_path).
host = unet_tests.host


def values(tier: str = "ram", disk: str = "", budget: str = "auto", text_encoder: bool = False,
           enabled: bool = True, blocks: int = 2) -> tuple[Any, ...]:  # fmt: skip
    """The accordion's values (webui/controls.py CONTROLS order)."""
    return (enabled, "block", blocks, tier, disk, 1, budget, False, text_encoder)


def plan(host: Any, sd: Any, vals: tuple[Any, ...]) -> str:
    return str(
        plan_mod.plan_text(
            sd, vals, default_disk_path=host.default_disk_path, load_saved=host.load_saved
        )
    )


def weights(sd: Any) -> dict[str, tuple[int, torch.device]]:
    """Every tensor of the checkpoint's UNet and CLIP: where its data is and on what device."""
    objects = sd.forge_objects
    mods = {"unet": objects.unet.model}
    if objects.clip is not None:
        mods["clip"] = objects.clip.cond_stage_model
    return {
        f"{m}.{name}": (t.data_ptr(), t.device)
        for m, mod in mods.items()
        for name, t in (*mod.named_parameters(), *mod.named_buffers())
    }


def no_layout(sd: Any) -> bool:
    """No Ferry layout object on the UNet's KModel or the CLIP's joint encoder."""
    kmodel = sd.forge_objects.unet.model
    joint = sd.forge_objects.clip.cond_stage_model if sd.forge_objects.clip else None
    attr = layout_mod.ForgeLayout.attr  # one layout per shared object, whatever network
    return attr not in kmodel.__dict__ and (joint is None or attr not in joint.__dict__)


def test_it_names_the_unet_with_the_planners_tier_and_reason(host: Any) -> None:
    sd = forge.load_checkpoint(0, name="tiny")
    text = plan(host, sd, values())
    unet = sd.forge_objects.unet.model.diffusion_model
    nbytes = network_module.network_from_module(unet, "tiny", "model").nbytes
    size = units.fmt_bytes(nbytes)
    # A CPU load device (the stand-in's): nothing to pin, and this small UNet fits in RAM.
    head = re.search(
        rf"\*\*UNet\*\* \(tiny, {re.escape(size)}\): \*\*ram\*\*, (\d+) block\(s\) per group, "
        r"look-ahead (\d+)\.",
        text,
    )
    assert head is not None, text
    # The stand-in UNet's longest run of blocks is 6 (input and output lists): a group fits it.
    assert 1 <= int(head[1]) <= 6 and 1 <= int(head[2]) <= 8
    assert f"Why: ram: {size} model tiny fits in " in text and "(CPU: nothing to pin)" in text
    assert "**Text encoder**" not in text
    assert "tick *Offload the text encoder too* to plan it" in text
    assert "Predicted: fits: peak RAM" in text
    assert "block 2, ram, look-ahead 1, VRAM budget auto: fits: peak RAM" in text


def test_with_the_text_encoder_box_it_plans_both_networks_nothing_moves(host: Any) -> None:
    sd = forge.load_text_checkpoint(0, ("clip_l", "t5xxl"))
    before = weights(sd)
    counts = dict(layout_mod.COUNTS)
    text = plan(host, sd, values(text_encoder=True))
    joint = sd.forge_objects.clip.cond_stage_model
    size = units.fmt_bytes(network_module.network_from_module(joint, "te", "text_encoder").nbytes)
    assert re.search(
        rf"\*\*Text encoder\*\* \(clip_l \+ t5xxl, {re.escape(size)}\): \*\*(ram|disk)\*\*", text
    ), text
    assert "text encoder clip_l + t5xxl fits in " in text
    assert "**UNet** (tiny-te," in text and "tick *Offload" not in text
    # Nothing moved, nothing laid out: every tensor where it was, no layout object made.
    assert weights(sd) == before
    assert no_layout(sd) and counts == layout_mod.COUNTS


def test_the_accordion_off_still_plans_and_says_forge_loads_it(host: Any) -> None:
    sd = forge.load_checkpoint(0, name="tiny")
    text = plan(host, sd, values(enabled=False))
    assert "**UNet** (tiny," in text
    assert "(the accordion is off: Forge loads it its own way): fits" in text


def test_no_checkpoint_is_said_and_nothing_is_loaded(host: Any) -> None:
    assert plan(host, None, values()) == plan_mod.NO_CHECKPOINT
    # Forge's stand-in model before the first load (FakeInitialModel): no forge_objects.
    assert plan(host, object(), values()) == plan_mod.NO_CHECKPOINT
    assert "no checkpoint is loaded" in plan_mod.NO_CHECKPOINT


def test_a_disk_folder_without_room_is_refused_naming_the_control(
    host: Any, tmp_path: Path
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    sd = forge.load_checkpoint(0, name="tiny")
    text = plan(host, sd, values(tier="disk", disk=str(a_file / "sub")))
    # The planner's refusal, named by the accordion's control (not the setting "disk_path").
    assert "block 2, disk, look-ahead 1, VRAM budget auto: does not fit: " in text
    assert "Ferry offload › Disk folder: " in text and "has no usable folder" in text
    # What Ferry would choose is still shown: the auto plan writes nothing there.
    assert "**UNet** (tiny," in text


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_unet_stored_as_forge_runs_it_is_read_in_place_on_disk(
    host: Any, tmp_path: Path, dtype: torch.dtype
) -> None:
    """The disk tier reads a safetensors checkpoint's UNet where Forge runs it as stored (the
    stand-in runs fp32): nothing written. A file Forge casts from is written to the folder."""
    safetensors = pytest.importorskip("safetensors.torch")
    path = tmp_path / "tiny.safetensors"
    sd = forge.load_checkpoint(0, name="tiny", filename=str(path))
    unet = sd.forge_objects.unet.model.diffusion_model
    stored = {f"model.diffusion_model.{k}": v.to(dtype) for k, v in unet.state_dict().items()}
    safetensors.save_file(stored, str(path))
    nbytes = network_module.network_from_module(unet, "tiny", "model").nbytes
    text = plan(host, sd, values(tier="disk", disk=str(tmp_path / "d")))
    assert "VRAM budget auto: fits: " in text, text
    written = "0 B" if dtype == torch.float32 else units.fmt_bytes(nbytes)
    assert text.endswith(f", disk {written}."), text


def test_a_setting_that_cannot_be_read_is_said_with_its_control(host: Any) -> None:
    sd = forge.load_checkpoint(0, name="tiny")
    text = plan(host, sd, values(budget="lots"))
    assert "**UNet** (tiny," in text  # the planner's choice does not need the settings
    assert "Not usable: Ferry offload › VRAM budget (GiB): " in text


def test_the_plan_button_shows_the_text_for_the_loaded_checkpoint(tmp_path: Path) -> None:
    gr = pytest.importorskip("gradio")
    loaded: list[Any] = [None]
    calls: list[int] = []

    def loaded_model() -> Any:
        calls.append(1)
        return loaded[0]

    class Accordion:  # Forge's InputAccordion: a checkbox inside an accordion
        def __init__(self, value: bool, label: str, elem_id: str) -> None:
            self.acc = gr.Accordion(label, open=value, elem_id=elem_id)
            self.value, self.label = value, label

        def __enter__(self) -> Any:
            self.acc.__enter__()
            return gr.Checkbox(self.value, label=self.label)

        def __exit__(self, *exc: Any) -> Any:
            return self.acc.__exit__(*exc)

    h = script_mod.Host(
        script_base=object, always_visible=None, gr=gr, input_accordion=Accordion,
        default_disk_path=str(tmp_path / "d"), loaded_model=loaded_model,
    )  # fmt: skip
    with gr.Blocks() as blocks:
        controls = script_mod.accordion(h, False)
    assert len(controls) == 9 and calls == []  # building it asks Forge for nothing
    button = next(
        b for b in blocks.blocks.values() if getattr(b, "elem_id", None) == "txt2img_ferry_plan"
    )
    (dep,) = [f for f in blocks.fns.values() if (button._id, "click") in f.targets]
    assert [i._id for i in dep.inputs] == [c._id for c in controls]
    assert dep.outputs[0].elem_id == "txt2img_ferry_plan_text"
    assert dep.fn(*values()) == plan_mod.NO_CHECKPOINT and calls == [1]
    loaded[0] = forge.load_checkpoint(0, name="tiny")
    assert "**UNet** (tiny," in dep.fn(*values())


def test_the_plan_route_answers_the_same_text(host: Any) -> None:
    sd = forge.load_text_checkpoint(0, ("clip_l",))
    h = dataclasses.replace(host, loaded_model=lambda: sd)
    route = routes.plan_route(h)
    got = route(tier="ram", blocks_per_group=2, text_encoder=True)["text"]
    assert "**Text encoder** (clip_l," in got and "**UNet** (tiny-te," in got
    # The accordion's defaults for the rest: tier, blocks per group and look-ahead on auto,
    # said resolved, as a generation with them runs them (the "networks" the route lists).
    default = route()
    assert default["text"].count("**Text encoder**") == 0
    (unet,) = default["networks"]
    said = f"block {unet['blocks_per_group']}, {unet['tier']}, look-ahead {unet['prefetch_depth']}"
    assert f"UNet: {said}, VRAM budget auto ({plan_mod.AUTO_NOTE})" in default["text"]
    assert (
        f"**{unet['tier']}**, {unet['blocks_per_group']} block(s) per group, look-ahead "
        f"{unet['prefetch_depth']}." in default["text"]
    )  # the same as "what Ferry would choose"
