"""Forge's text encoders through the Ferry accordion ("Offload the text encoder too"), against
the stand-ins of Forge's CLIP, its text-processing engines and its loader
(tests/webui_standins.py): what only the text encoder has (its box, its engines, its encoders'
names). What holds for every network (every tier and level, the layout kept and released) is
tested once for the UNet and the text encoder, as a parameter: tests/test_webui_forge.py.
tests/forge/test_forge_text_encoder.py runs them in a real Forge."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import test_webui_forge as unet_tests
from tests import webui_standins as forge
from tests.conftest import PACK_NAME, load_pack

load_pack()
controls = importlib.import_module(f"{PACK_NAME}.webui.controls")
layout_mod = importlib.import_module(f"{PACK_NAME}.webui.live_layout")
patcher_mod = importlib.import_module(f"{PACK_NAME}.webui.patcher")
site = importlib.import_module(f"{PACK_NAME}.seam.site")
oc = importlib.import_module(f"{PACK_NAME}.offload_core")


def ferry(tier: str = "ram", level: str = "block", blocks: int = 1, disk: str = "",
          text_encoder: bool = True, enabled: bool = True) -> tuple[Any, ...]:  # fmt: skip
    """The accordion's values (webui/controls.py CONTROLS), the text-encoder box last."""
    return unet_tests.ferry(tier, level, blocks, disk, enabled=enabled, text_encoder=text_encoder)


#: The Forge host's fixture (its default disk folder and settings file under tmp_path).
host = unet_tests.host
TOKENS = unet_tests.TOKENS


def Session(host: Any, encoders: tuple[str, ...] = ("clip_l",)) -> Any:
    """One Forge process whose checkpoint's CLIP holds ``encoders``, the text encoder driven
    through the accordion (tests/test_webui_forge.py Session; every tier and level, the layout
    kept and released are tested there, for both networks)."""
    return unet_tests.Session(host, network="text_encoder", encoders=encoders)


@pytest.fixture
def session(host: Any) -> Any:
    s = Session(host)
    yield s
    s.layout.release()


def test_off_by_default_leaves_forges_clip(session: Any) -> None:
    plain, _ = session.encode()
    for args in (ferry(text_encoder=False), ferry(enabled=False), ferry()[:8]):
        got, p = session.encode(args)
        assert torch.equal(got, plain)
        assert type(session.sd.forge_objects.clip.patcher) is forge.ModelPatcher
        assert oc.find_offload(session.joint) is None
        assert "text encoder" not in p.extra_generation_params.get("Ferry", "")


def test_box_off_releases_and_forge_loads_its_plain_encoder(session: Any) -> None:
    plain, _ = session.encode()
    session.encode(ferry(level="leaf"))
    assert oc.find_offload(session.joint) is not None
    got, _ = session.encode(ferry(text_encoder=False))
    assert torch.equal(got, plain) and oc.find_offload(session.joint) is None


def test_lora_on_the_text_encoder_is_forges_lora(session: Any, tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(9)
    lora = {
        k: (torch.randn(32, 4, generator=g) * 0.1, torch.randn(4, 32, generator=g))
        for k in ("clip_l.layers.0.to_q.weight", "clip_l.layers.3.proj.weight")
    }
    plain_lora, _ = session.encode(lora=lora)
    plain, _ = session.encode()
    assert not torch.equal(plain_lora, plain)
    for args in (ferry(tier="ram"), ferry(tier="disk", disk=str(tmp_path), level="leaf")):
        got, _ = session.encode(args, lora=lora)
        assert torch.equal(got, plain_lora), args
    got, _ = session.encode(ferry(tier="ram"))  # LoRA gone: the original weights are back
    assert torch.equal(got, plain)


def test_two_encoders_are_one_network_each_layer_list_its_groups(host: Any) -> None:
    s = Session(host, encoders=("clip_l", "t5xxl"))
    try:
        plain, _ = s.encode()
        got, _ = s.encode(ferry(tier="ram"))
        assert torch.equal(got, plain)
        handle = s.layout.handle
        assert handle is not None and len(handle.plan.groups) == 4 + 6
        assert handle.stats().forwards == 4  # two chunks through each engine
    finally:
        s.layout.release()


def test_too_many_blocks_for_the_encoder_is_refused_before_anything_moves(session: Any) -> None:
    plain, _ = session.encode()
    with pytest.raises(controls.ControlError) as e:
        session.encode(ferry(blocks=5))  # the UNet has 6 in a row, this encoder 4
    assert str(e.value).startswith(
        "Ferry offload › Blocks per group: the text encoder has at most 4 blocks in a row; "
        "choose 1..4"
    ), e.value
    assert oc.find_offload(session.joint) is None
    got, _ = session.encode(ferry(blocks=4))  # the next generation works
    assert torch.equal(got, plain)


def test_a_tensor_ferry_cannot_move_is_refused_naming_the_box(session: Any) -> None:
    enc = session.joint.clip_l
    enc.final_norm.weight = torch.nn.Parameter(
        torch.ones(32).to_sparse(), requires_grad=False
    )  # a sparse tensor: offload_core refuses it by name
    with pytest.raises(controls.ControlError) as e:
        session.encode(ferry())
    assert str(e.value).startswith(
        "Ferry offload › Offload the text encoder too: the text encoder's clip_l.final_norm."
    ), e.value
    assert "Turn Offload the text encoder too off" in str(e.value)
    assert oc.find_offload(session.joint) is None


def test_the_clone_keeps_the_text_encoders_class_and_offload(session: Any) -> None:
    session.encode(ferry())
    clip = session.sd.forge_objects.clip
    again = clip.clone()  # a script cloning the CLIP after Ferry's (sd_forge_lora does)
    assert isinstance(again.patcher, patcher_mod.FerryPatcherMixin)
    assert again.patcher.ferry_site is site.TEXT_ENCODER
    assert again.patcher.ferry_offload == clip.patcher.ferry_offload
    assert again.cond_stage_model is session.joint


def test_the_panels_apply_finds_the_text_encoders_layout(session: Any) -> None:
    """The Ferry tab's Apply (webui/entry.py release_from_panel) looks among the model's
    layouts: the text encoder's is one, released like the UNet's."""
    session.encode(ferry())
    handle = session.layout.handle
    found = [lay for lay in layout_mod.layouts_of(session.sd) if lay.handle is handle]
    assert found == [session.layout] and found[0].release() and handle.removed
    unet, joint = (lay.module for lay in layout_mod.layouts_of(session.sd))
    assert unet is session.sd.forge_objects.unet.model.diffusion_model and joint is session.joint


def test_the_hires_pass_encodes_through_ferry_too(session: Any) -> None:
    """processing.py ``sample_hr_pass``: the hires prompts are encoded (calculate_hr_conds)
    with the objects the first pass's ``process_before_every_sampling`` left, after
    ``sample`` reset them to the LoRA'd ones (no process_batch in between)."""
    plain, _ = session.encode()
    sd = session.sd
    sd.forge_objects = sd.forge_objects_after_applying_lora.shallow_copy()  # sample()
    p = forge.Processing(sd)
    session.script.process_before_every_sampling(p, *ferry(level="leaf"), x=None)
    got = sd.get_learned_conditioning(session.mm, TOKENS)  # calculate_hr_conds
    handle = session.layout.handle
    assert torch.equal(got, plain)
    assert handle is not None and handle.policy.level_name == "leaf"
    assert handle.stats().forwards == 2
