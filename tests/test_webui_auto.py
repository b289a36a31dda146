"""The "Ferry offload" accordion's ``auto`` (webui/controls.py ``Asked``, webui/auto_plan.py):
tier, blocks per group and look-ahead left to offload_core's planner, the default for new
users; numbers (saved settings, infotext, API callers) keep working. One plan answers the
generation, the Plan button and ``GET /ferry/plan``, and it counts the Steps and CFG the
generation uses. On the stand-ins of tests/webui_standins.py."""

from __future__ import annotations

import dataclasses
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
auto_plan = importlib.import_module(f"{PACK_NAME}.webui.auto_plan")
plan_mod = importlib.import_module(f"{PACK_NAME}.webui.plan")
plan_button = importlib.import_module(f"{PACK_NAME}.webui.plan_button")
script_mod = importlib.import_module(f"{PACK_NAME}.webui.script")
routes = importlib.import_module(f"{PACK_NAME}.webui.routes")
layout_mod = importlib.import_module(f"{PACK_NAME}.webui.live_layout")
oc = importlib.import_module(f"{PACK_NAME}.offload_core")
planner = importlib.import_module(f"{PACK_NAME}.offload_core.planner")

host = unet_tests.host
Session = unet_tests.Session
X = unet_tests.X


def values(tier: Any = "auto", blocks: Any = "auto", look: Any = "auto", level: str = "block",
           text_encoder: bool = False, budget: str = "auto", use_saved: bool = False,
           enabled: bool = True, disk: str = "") -> tuple[Any, ...]:  # fmt: skip
    """The accordion's values (webui/controls.py CONTROLS order)."""
    return (enabled, level, blocks, tier, disk, look, budget, use_saved, text_encoder)


def asked(vals: tuple[Any, ...], h: Any) -> Any:
    return controls.asked_from_controls(
        vals, default_disk_path=h.default_disk_path, load_saved=h.load_saved
    )


@pytest.fixture(autouse=True)
def fresh_plans() -> Any:
    auto_plan.forget()
    yield
    auto_plan.forget()


def test_new_users_get_auto_and_numbers_keep_working(host: Any) -> None:
    for cid in controls.AUTO_CONTROLS:
        assert controls.DEFAULTS[cid] == "auto"
        assert controls.controls_dict([True])[cid] == "auto"  # an API caller's missing values
    a = asked(controls.controls_dict([True]).values(), host)
    assert a.wish == planner.Wish() and a.planned
    # Numbers, as an infotext pastes them, sliders sent them (2.0) or a box holds them ("2"):
    # nothing is left to the planner, and the policy is the one the flat form gives.
    for blocks, look in ((2, 1), (2.0, 1.0), ("2", " 1 ")):
        got = asked(values(tier="ram", blocks=blocks, look=look), host)
        assert not got.planned
        assert got.policy() == oc.OffloadPolicy.from_dict(
            {"level": "block", "blocks_per_group": 2, "tier": "ram", "prefetch_depth": 1,
             "vram_budget_gb": "auto"}
        )  # fmt: skip
    pasted = controls.parse_infotext("block 3, disk, look-ahead 2, VRAM budget auto")
    got = asked(tuple(pasted.get(cid, "") for cid, _ in controls.CONTROLS), host)
    assert not got.planned and got.policy().tier == oc.DiskTier(host.default_disk_path)
    # Layer by layer has no blocks per group: its box is not read, auto or not.
    assert not asked(values(tier="ram", level="leaf", blocks="lots", look=1), host).planned
    # Each auto control alone is the planner's; the others stay the user's.
    assert asked(values(tier="ram", look=2), host).wish == planner.Wish("ram", None, 2)


@pytest.mark.parametrize(
    ("vals", "message"),
    [
        (values(blocks="lots"), "Ferry offload › Blocks per group: must be a whole number >= 1"),
        (values(look=9), "Ferry offload › Look-ahead: must be a whole number 1..8"),
        (values(tier="fast"), "Ferry offload › Where the rest waits: must be 'auto' or one of"),
    ],
)
def test_a_bad_value_beside_auto_names_its_control(host: Any, vals: Any, message: str) -> None:
    with pytest.raises(controls.ControlError) as e:
        asked(vals, host)
    assert str(e.value).startswith(message), str(e.value)


def test_the_choice_is_applied_as_typed_values(host: Any) -> None:
    """Asked.policy takes the planner's Choice as it is (no widget string in between): the
    tier object of its tier name (the disk tier in the accordion's folder), its blocks per
    group and look-ahead; what the user fixed stays."""
    sd = forge.load_checkpoint(0)
    nets = auto_plan.loaded_networks(sd, False)
    a = asked(values(look=3), host)
    choice = auto_plan.plan_for(sd, nets, a, 40.0).choices[0]
    for tier, cls in (("pinned", oc.PinnedRamTier), ("ram", oc.RamTier), ("disk", oc.DiskTier)):
        c = dataclasses.replace(choice, tier=tier)
        policy = a.policy(c)
        assert type(policy.tier) is cls and policy.level == oc.BlockLevel(c.blocks_per_group)
        assert policy.prefetch_depth == 3 and policy.vram_budget == "auto"
    assert a.policy(dataclasses.replace(choice, tier="disk")).tier.path == host.default_disk_path
    with pytest.raises(ValueError, match="plan it first"):
        a.policy(None)


def test_auto_runs_the_planners_choice_equal_to_forced_and_to_forge(
    host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Session(host)
    try:
        plain, _ = s.run()
        # No flat-form round trip on the way: the choice reaches the policy typed.
        real_from_dict = oc.OffloadPolicy.from_dict
        monkeypatch.setattr(
            oc.OffloadPolicy, "from_dict", classmethod(lambda cls, d: pytest.fail(f"from_dict {d}"))
        )
        got, p = s.run(values())
        monkeypatch.setattr(oc.OffloadPolicy, "from_dict", real_from_dict)
        assert torch.equal(got, plain)
        handle = s.layout.handle
        nets = auto_plan.loaded_networks(s.sd, False)
        choice = auto_plan.plan_for(s.sd, nets, asked(values(), host), 40.0).choices[0]
        policy = handle.policy
        assert (policy.tier_name, policy.level.blocks_per_group, policy.prefetch_depth) == (
            choice.tier, choice.blocks_per_group, choice.prefetch_depth
        )  # fmt: skip
        # The image's parameters say what ran, in numbers: pasted, they force the same.
        assert p.extra_generation_params["Ferry"] == controls.describe(policy)
        forced = values(choice.tier, choice.blocks_per_group, choice.prefetch_depth)
        layouts = layout_mod.COUNTS["layouts"]
        again, _ = s.run(forced)
        assert torch.equal(again, plain)
        # The forced choice is the same offload: Forge keeps the layout auto made.
        assert s.layout.handle is handle and layout_mod.COUNTS["layouts"] == layouts
    finally:
        s.layout.release()


def test_a_refused_plan_stops_the_generation_naming_a_control(host: Any, tmp_path: Path) -> None:
    """The disk tier forced into a folder that cannot be one, the rest on auto: the plan
    refuses before any weight moves, in the accordion's words (not the setting's)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    s = Session(host)
    with pytest.raises(controls.ControlError) as e:  # raised where Forge loads the UNet
        s.run(values(tier="disk", disk=str(a_file / "sub")))
    assert str(e.value).startswith("Ferry offload › Disk folder: "), str(e.value)
    assert "or set tier to auto" in str(e.value)
    assert layout_mod.COUNTS["last_refusal"] == str(e.value) and s.layout.handle is None


def test_one_plan_answers_the_generation_the_button_and_the_route(host: Any) -> None:
    """With the text encoder too: the route's networks are what the generation then runs,
    each network its own choice, even planned anew (nothing kept in between)."""
    s = Session(host, network="text_encoder")
    try:
        h = dataclasses.replace(host, loaded_model=lambda: s.sd)
        vals = values(text_encoder=True)
        answer = routes.plan_route(h)(enabled=True, text_encoder=True)
        text = plan_mod.plan_text(
            s.sd, vals, default_disk_path=h.default_disk_path, load_saved=h.load_saved
        )
        assert text == answer["text"]
        unet, te = answer["networks"]
        assert (unet["title"], te["title"]) == ("UNet", "Text encoder")
        auto_plan.forget()  # the generation plans on its own: the same figures, the same answer
        s.encode(vals)
        te_policy = s.layout.handle.policy
        s.run(vals)
        unet_policy = layout_mod.ForgeLayout.of_patcher(
            s.kmodel, script_mod.DIFFUSION_MODEL
        ).handle.policy
        for said, policy in ((unet, unet_policy), (te, te_policy)):
            assert {k: v for k, v in said.items() if k != "title"} == plan_mod._settings(policy)
    finally:
        s.layout.release()
        layout_mod.ForgeLayout.of_patcher(s.kmodel, script_mod.DIFFUSION_MODEL).release()


@pytest.mark.parametrize(
    ("steps", "cfg", "reads"), [(20, 7.0, 40.0), (8, 1.0, 8.0), (30, 1.5, 60.0), ("x", 7, 40.0)]
)
def test_the_unet_is_read_once_a_step_and_pass(steps: Any, cfg: Any, reads: float) -> None:
    assert auto_plan.unet_reads(steps, cfg) == reads


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The UNet's reads per generation each plan was made with."""
    seen: list[float] = []
    real = auto_plan.plan_graph

    def plan_graph(machine: Any, nets: Any, **kw: Any) -> Any:
        seen.append(nets[0].reads_per_prompt)
        return real(machine, nets, **kw)

    monkeypatch.setattr(auto_plan, "plan_graph", plan_graph)
    return seen


def test_the_plan_and_the_generation_count_the_steps_and_cfg(
    host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _recorded(monkeypatch)
    sd = forge.load_checkpoint(0)
    h = dataclasses.replace(host, loaded_model=lambda: sd)
    text = routes.plan_route(h)(enabled=True, steps=8, cfg_scale=1.0)["text"]
    assert seen == [8.0]  # every control auto: "what Ferry would choose" is that same plan
    assert "Planned for 8 steps at CFG 1 (one pass a step, " in text
    assert "the UNet is read 8 times a generation." in text
    routes.plan_route(h)(enabled=True, steps=30, cfg_scale=7.0)
    assert seen == [8.0, 60.0]
    auto_plan.forget()
    mm = forge.MemoryManager()
    s = unet_tests.Script(host)
    forge.generate(mm, sd, [(s, values())], X, steps=8, cfg_scale=1.0)
    assert seen[-1] == 8.0
    layout_mod.ForgeLayout.of_patcher(
        sd.forge_objects_original.unet.model, script_mod.DIFFUSION_MODEL
    ).release()


class HookedScript:
    """A scripts.Script's ``on_after_component`` (Forge calls the callback when a component
    of that elem_id is built)."""

    def __init__(self) -> None:
        self.hooks: dict[str, Any] = {}

    def on_after_component(self, callback: Any, *, elem_id: str) -> None:
        self.hooks[elem_id] = callback


class On:
    def __init__(self, component: Any) -> None:
        self.component = component


@pytest.mark.parametrize("sliders_first", [True, False])
def test_the_plan_button_waits_for_both_sliders(sliders_first: bool) -> None:
    script, button, wired = HookedScript(), plan_button.PlanButton(), []
    button.watch(script, "img2img")
    assert set(script.hooks) == {"img2img_steps", "img2img_cfg_scale"}
    if sliders_first:  # Forge's layout: the sliders are built before the scripts' accordions
        script.hooks["img2img_steps"](On("steps"))
        script.hooks["img2img_cfg_scale"](On("cfg"))
    button.wire(wired.append)
    if not sliders_first:
        assert wired == []
        script.hooks["img2img_cfg_scale"](On("cfg"))
        assert wired == []
        script.hooks["img2img_steps"](On("steps"))
    assert wired == [["steps", "cfg"]]
    # A host without the hook (CI's stand-ins): wired at once, with no sliders.
    bare, wired = plan_button.PlanButton(), []
    bare.watch(object(), "txt2img")
    bare.wire(wired.append)
    assert wired == [[]]


def test_the_plan_buttons_click_reads_forges_sliders(tmp_path: Path) -> None:
    gr = pytest.importorskip("gradio")
    sd = forge.load_checkpoint(0)

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
        default_disk_path=str(tmp_path / "d"), loaded_model=lambda: sd,
    )  # fmt: skip
    script, button = HookedScript(), plan_button.PlanButton()
    button.watch(script, "txt2img")
    with gr.Blocks() as blocks:
        steps = gr.Slider(1, 150, value=20, elem_id="txt2img_steps")
        cfg = gr.Slider(1, 30, value=7, elem_id="txt2img_cfg_scale")
        script.hooks["txt2img_steps"](On(steps))
        script.hooks["txt2img_cfg_scale"](On(cfg))
        controls_ = script_mod.accordion(h, False, button)
    (tier,) = [c for c in controls_ if getattr(c, "elem_id", None) == "txt2img_ferry_tier"]
    assert tier.value == "auto" and ("Auto (Ferry chooses)", "auto") in [
        tuple(c) for c in tier.choices
    ]
    plan = next(
        b for b in blocks.blocks.values() if getattr(b, "elem_id", None) == "txt2img_ferry_plan"
    )
    (dep,) = [f for f in blocks.fns.values() if (plan._id, "click") in f.targets]
    assert [i._id for i in dep.inputs] == [c._id for c in controls_] + [steps._id, cfg._id]
    vals = tuple(c.value for c in controls_)
    text = dep.fn(*vals, 8, 1.0)
    assert text == plan_mod.plan_text(
        sd, vals, default_disk_path=h.default_disk_path, load_saved=h.load_saved,
        steps=8, cfg_scale=1.0,
    )  # fmt: skip
    assert "**UNet** (tiny," in text
