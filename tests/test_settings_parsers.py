"""One parser per setting: the ComfyUI node, the panel, Forge's accordion and the API give one
input one verdict.

Each input goes through the real entry points (the node's widgets -> policy, the panel's form
-> settings, the Forge accordion's values -> policy, the flat form -> OffloadPolicy.from_dict,
which the settings file also uses) and every path must agree: the same accepted value, or a refusal naming the
setting. The disk folder goes through the node's check, the panel's live check and the
applying path (apply_offload, which creates and probes the folder for real).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PACK_NAME, load_pack
from tests.helpers import make_model, tmpfs

load_pack()
config = importlib.import_module(f"{PACK_NAME}.nodes.planning.config")
forms = importlib.import_module(f"{PACK_NAME}.web.panel.forms")
disk_check = importlib.import_module(f"{PACK_NAME}.web.panel.disk_check")
oc = importlib.import_module(f"{PACK_NAME}.offload_core")
controls = importlib.import_module(f"{PACK_NAME}.webui.controls")

GIB = 1 << 30
REJECTED = "rejected"

NODE_WIDGETS = dict(
    level="block", blocks_per_group=1, tier="ram", disk_path="", prefetch_depth=1, vram_budget=""
)
# Form order: level, blocks, tier, disk_path, prefetch, vram_budget, headroom, quant.
PANEL_FORM = ["block", 1, "ram", "", 1, "", 2.0, "none"]
FORGE_DEFAULT_FOLDER = "/forge/data/ferry-offload"


def forge(**values: Any) -> Any:
    """Forge's "Ferry offload" accordion (webui/controls.py) with ``values`` -> its policy."""
    # Numbers where the accordion's default is auto (the planner's, not a parser's verdict).
    fixed = {"tier": "ram", "blocks_per_group": 1, "prefetch_depth": 1, "vram_budget": ""}
    c = {**controls.DEFAULTS, "enabled": True, **fixed, **values}
    offload = controls.offload_from_controls(
        [c[cid] for cid, _ in controls.CONTROLS],
        default_disk_path=FORGE_DEFAULT_FOLDER,
        load_saved=lambda: None,
    )
    return offload.policy


def verdict(build: Callable[[], Any], settings: tuple[str, ...]) -> Any:
    """The accepted value, or REJECTED when the error names one of ``settings``."""
    try:
        return build()
    except oc.FerryError as e:
        named = next(n for a in ("input_name", "setting", "control") if (n := getattr(e, a, None)))
        assert named in settings, f"the error names {named!r}, not the setting: {e}"
        return REJECTED


# ---- VRAM budget ----------------------------------------------------------------------------
# "0" streams every group, as "" does (see parse_vram_budget); "1e3" is not a plain number of
# GB and is refused everywhere.
BUDGETS = {
    "": None,
    "0": None,
    "auto": "auto",
    "6": 6 * GIB,
    "-1": REJECTED,
    "abc": REJECTED,
    "1e3": REJECTED,
}
BUDGET_NAMES = ("vram_budget", "vram_budget_gb")


def budget_paths(text: str) -> dict[str, Callable[[], Any]]:
    form = list(PANEL_FORM)
    form[5] = text
    return {
        "node": lambda: config.policy_from_inputs(**{**NODE_WIDGETS, "vram_budget": text}),
        "panel": lambda: forms.settings_from_form(*form).policy,
        "forge": lambda: forge(vram_budget=text),
        "api": lambda: oc.OffloadPolicy.from_dict({"vram_budget_gb": text}),
    }


@pytest.mark.parametrize("text", list(BUDGETS))
def test_vram_budget_one_verdict_everywhere(text: str) -> None:
    got = {}
    for path, build in budget_paths(text).items():
        result = verdict(build, BUDGET_NAMES)
        got[path] = result if result == REJECTED else result.vram_budget
    assert got == dict.fromkeys(got, BUDGETS[text])


@pytest.mark.parametrize("text", ["-1", "abc", "1e3"])
def test_vram_budget_refusal_says_what_to_type(text: str) -> None:
    for build in budget_paths(text).values():
        with pytest.raises(oc.FerryError) as e:
            build()
        assert f"{text!r} is not a budget" in str(e.value)
        assert "'auto'" in str(e.value) and "empty" in str(e.value) and "e.g. 6" in str(e.value)


# ---- Blocks per group -----------------------------------------------------------------------
# A huge number is a whole number >= 1 (the parsers accept it); the model refuses it, naming
# the setting, when the plan is drawn. So the verdict includes planning on a real model.
HUGE = 10**6
BLOCKS = {0: REJECTED, 1: 1, HUGE: REJECTED, "x": REJECTED}


def blocks_paths(value: Any) -> dict[str, Callable[[], Any]]:
    form = list(PANEL_FORM)
    form[1] = value
    return {
        "node": lambda: config.policy_from_inputs(**{**NODE_WIDGETS, "blocks_per_group": value}),
        "panel": lambda: forms.settings_from_form(*form).policy,
        "forge": lambda: forge(blocks_per_group=value),
        "api": lambda: oc.OffloadPolicy.from_dict({"tier": "ram", "blocks_per_group": value}),
    }


@pytest.mark.parametrize("value", list(BLOCKS), ids=str)
def test_blocks_per_group_one_verdict_everywhere(value: Any) -> None:
    model = make_model("fp32")
    got = {}
    for path, build in blocks_paths(value).items():

        def planned(build: Callable[[], Any] = build) -> int:
            policy = build()
            oc.plan_offload(model, policy, onload_device="cpu")
            return int(policy.level.blocks_per_group)

        got[path] = verdict(planned, ("blocks_per_group",))
    assert got == dict.fromkeys(got, BLOCKS[value])


# ---- The disk folder ------------------------------------------------------------------------


def folder_verdicts(path: str) -> dict[str, Any]:
    """ok/REJECTED from the node's check, the panel's check and apply_offload itself."""
    model = make_model("fp32")
    plan = oc.plan_offload(model, oc.OffloadPolicy(tier=oc.RamTier()), onload_device="cpu")
    need = plan.offloaded_bytes

    def node() -> str:
        config.check_disk_folder(path, need)
        return "ok"

    def panel() -> str:
        check = disk_check.check_disk_path(path, need)
        return "ok" if check.ok else REJECTED

    def api() -> str:
        oc.apply_offload(
            model, oc.OffloadPolicy(tier=oc.DiskTier(path)), onload_device="cpu"
        ).remove()
        return "ok"

    return {
        "node": verdict(node, ("disk_path",)),
        "panel": verdict(panel, ("disk_path",)),
        "api": verdict(api, ("disk_path",)),
    }


def same_words(path: str) -> None:
    """The node and the panel say the same thing about a refused folder."""
    with pytest.raises(config.NodeInputError) as e:
        config.check_disk_folder(path, 1 << 20)
    assert str(e.value) == f"disk_path: {disk_check.check_disk_path(path, 1 << 20).message}"


def test_a_file_is_refused_everywhere(tmp_path: Path) -> None:
    f = tmp_path / "file.bin"
    f.write_bytes(b"user data")
    assert folder_verdicts(str(f)) == dict.fromkeys(("node", "panel", "api"), REJECTED)
    same_words(str(f))
    assert f.read_bytes() == b"user data"


def test_a_missing_but_creatable_folder_is_accepted_everywhere(tmp_path: Path) -> None:
    new = tmp_path / "a" / "b"
    assert disk_check.check_disk_path(str(new), None).ok
    assert not (tmp_path / "a").exists(), "the checks create nothing"
    assert folder_verdicts(str(new)) == dict.fromkeys(("node", "panel", "api"), "ok")


def test_a_read_only_folder_is_refused_everywhere(tmp_path: Path) -> None:
    # A read-only mount: access() answers EROFS even to root, as CI runs.
    with tmpfs(tmp_path / "ro", "1m", readonly=True) as ro:
        for path in (ro, ro / "sub"):
            assert folder_verdicts(str(path)) == dict.fromkeys(("node", "panel", "api"), REJECTED)
            same_words(str(path))


def test_a_folder_too_small_is_refused_everywhere(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "2m") as small:
        assert folder_verdicts(str(small)) == dict.fromkeys(("node", "panel", "api"), REJECTED)
        same_words(str(small))
        assert list(small.iterdir()) == [], "nothing written"


# ---- The planner's boxes, and the disk folder from every front end --------------------------
planner_view = importlib.import_module(f"{PACK_NAME}.web.panel.planner_view")


class _Measured(Exception):
    """The planner got past its checks: what it was about to measure under."""

    def __init__(self, budget: Any, disk: Any) -> None:
        self.budget, self.disk = budget, disk


def planner(vram: Any, disk: str = "", monkeypatch: pytest.MonkeyPatch | None = None) -> Any:
    """The planner tab's own path (web/panel/planner_view.run_planner) up to its measuring,
    which is stopped there: returns (budget, disk folder) or raises its refusal."""
    assert monkeypatch is not None

    def measure(factory: Any, *, budget: Any, disk_path: Any, **kw: Any) -> Any:
        raise _Measured(budget, disk_path)

    monkeypatch.setattr(planner_view, "autotune", measure)
    monkeypatch.setattr(planner_view, "demo_factory", lambda size: None)
    ctx = type("Ctx", (), {"onload_device": "cpu", "is_busy": lambda self: False})()
    ctx.run_lock = __import__("threading").Lock()  # type: ignore[attr-defined]
    try:
        planner_view.run_planner(ctx, vram, None, 0.01, disk)
    except _Measured as m:
        return m.budget, m.disk
    raise AssertionError("the planner neither measured nor refused")


@pytest.mark.parametrize("text", [t for t in BUDGETS if t != "auto"])
def test_the_planner_reads_a_vram_budget_as_the_node_and_the_panel(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = verdict(lambda: planner(text, monkeypatch=monkeypatch)[0].vram_bytes, BUDGET_NAMES)
    assert got == BUDGETS[text]
    # The browser's number box sends a number: 0 and 6 read as "0" and "6" do.
    if BUDGETS[text] != REJECTED and text:
        number = float(text)
        assert planner(number, monkeypatch=monkeypatch)[0].vram_bytes == BUDGETS[text]


def test_the_planner_refuses_auto_saying_what_to_type(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(oc.ConfigError, match=r"^vram_budget_gb: .*e\.g\. 6"):
        planner("auto", monkeypatch=monkeypatch)


def disk_paths(text: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Callable[[], Any]]:
    form = list(PANEL_FORM)
    form[2], form[3] = "disk", text

    def node() -> str:
        policy = config.policy_from_inputs(**{**NODE_WIDGETS, "tier": "disk", "disk_path": text})
        return str(config.check_disk_folder(policy.tier.path))

    def panel() -> str:
        path = forms.settings_from_form(*form).policy.tier.path
        return str(disk_check.check_disk_path(path, None).raise_if_bad())

    def in_forge() -> str:
        offload = controls.ForgeOffload(forge(tier="disk", disk_path=text))
        controls.check_folder(offload)  # the accordion's read-only check, before a generation
        return str(offload.policy.tier.path)

    return {
        "node": node,
        "panel": panel,
        "forge": in_forge,
        "planner": lambda: str(planner(None, text, monkeypatch)[1]),
        "api": lambda: oc.OffloadPolicy.from_dict({"tier": "disk", "disk_path": text}).tier.path,
        "tier": lambda: str(oc.plan_offload(make_model("fp32"), oc.OffloadPolicy(
            tier=oc.DiskTier(text)), onload_device="cpu").policy.tier.path),
    }  # fmt: skip


@pytest.mark.parametrize("text", ["relative/dir", "./here", "ferry"])
def test_a_relative_folder_is_refused_everywhere_in_the_same_words(
    text: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    words = set()
    for path, build in disk_paths(text, monkeypatch).items():
        with pytest.raises(oc.FerryError) as e:
            build()
        if isinstance(e.value, controls.ControlError):  # Forge names its control, by label
            assert e.value.control == "disk_path", (path, e.value)
            assert str(e.value).startswith("Ferry offload › Disk folder: "), e.value
            words.add(e.value.message)
            continue
        named = getattr(e.value, "input_name", None) or getattr(e.value, "setting", None)
        assert named == "disk_path", (path, e.value)
        words.add(str(e.value).split("disk_path: ", 1)[1].removesuffix(
            " (or clear it to skip the disk tier)"))  # fmt: skip
    assert words == {f"use a full path (starting with / or a drive), not {text!r}"}
    assert list(tmp_path.iterdir()) == [], "nothing was created"


def test_a_full_folder_is_the_same_folder_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = str(tmp_path / "new")
    got = {path: build() for path, build in disk_paths(f"  {folder} ", monkeypatch).items()}
    assert got == dict.fromkeys(got, folder)


def test_an_empty_folder_is_the_hosts_default_or_refused_in_the_same_words(
    tmp_path: Path,
) -> None:
    """The node's host has a default folder (ComfyUI's temp folder), and so has Forge's
    accordion (``ferry-offload`` in the WebUI's data folder); the panel, the settings file and
    the API have none: there the one parser refuses it, in the read-only check's words."""
    node = config.policy_from_inputs(
        **{**NODE_WIDGETS, "tier": "disk", "disk_path": "  "}, default_disk_path=str(tmp_path)
    )
    assert node.tier.path == str(tmp_path)
    for empty in ("  ", "", None):
        assert forge(tier="disk", disk_path=empty).tier.path == FORGE_DEFAULT_FOLDER
    asked = disk_check.check_disk_path("", None).message
    form = list(PANEL_FORM)
    form[2] = "disk"
    for build in (
        lambda: forms.settings_from_form(*form),
        lambda: oc.OffloadPolicy.from_dict({"tier": "disk"}),
        lambda: oc.OffloadPolicy(tier=oc.DiskTier("")).validate(),
    ):
        with pytest.raises(oc.FerryError) as e:
            build()
        assert str(e.value).endswith(f"disk_path: {asked}"), e.value
