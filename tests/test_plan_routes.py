"""The pre-flight and budget routes' logic (nodes/ui/api.py), the per-prompt disk reads and the
planner's sentence on each stats line (nodes/ui/stats.py, prompt_reads.py), each carried by
its layout's stats."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PACK_NAME, load_pack

load_pack()
api = importlib.import_module(f"{PACK_NAME}.nodes.ui.api")
stats = importlib.import_module(f"{PACK_NAME}.nodes.ui.stats")
report = importlib.import_module(f"{PACK_NAME}.nodes.ui.report")
prompt_reads = importlib.import_module(f"{PACK_NAME}.nodes.ui.prompt_reads")
errors = importlib.import_module(f"{PACK_NAME}.offload_core.errors")
monitor = importlib.import_module(f"{PACK_NAME}.offload_core.tools.monitor")
settings_file = importlib.import_module(f"{PACK_NAME}.offload_core.tools.settings_file")
GIB = 1 << 30

PROMPT = {"1": {"class_type": "UNETLoader", "inputs": {"unet_name": "m.safetensors"}}}


def test_post_plan_takes_the_prompt_or_the_queued_payload() -> None:
    seen: list[Any] = []

    def plan(prompt: dict[str, Any]) -> dict[str, Any]:
        seen.append(prompt)
        return {"fits": True}

    assert api.post_plan(PROMPT, plan) == (200, {"fits": True})
    assert api.post_plan({"prompt": PROMPT, "client_id": "x"}, plan) == (200, {"fits": True})
    assert seen == [PROMPT, PROMPT]


@pytest.mark.parametrize("body", [None, [], {}, {"prompt": 7}, {"prompt": []}, "x"])
def test_post_plan_refuses_what_is_not_a_workflow(body: Any) -> None:
    status, reply = api.post_plan(body, lambda p: pytest.fail("planned a non-workflow"))
    assert status == 400 and reply["setting"] == "prompt" and "API format" in reply["error"]


def test_post_plan_answers_a_ferry_nodes_bad_widget_with_a_400_naming_it() -> None:
    # The plan parses each Ferry node's widgets (graph_plan.py): a bad one is the user's to fix.
    input_error = importlib.import_module(f"{PACK_NAME}.nodes.input_error")

    def plan(prompt: dict[str, Any]) -> dict[str, Any]:
        raise input_error.NodeInputError("tier", "must be one of ['auto', ...] (node 2)")

    status, reply = api.post_plan(PROMPT, plan)
    assert status == 400 and reply["setting"] == "tier"
    assert reply["error"].startswith("tier: ") and "(node 2)" in reply["error"]


@pytest.mark.parametrize(
    ("body", "setting"),
    [({"prompt": {"1": {"inputs": {}}}}, "prompt.1.class_type"),
     ({"1": {"class_type": "", "inputs": {}}}, "1.class_type"),
     ({"1": {"class_type": 5, "inputs": {}}}, "1.class_type"),
     ({"prompt": {"1": []}}, "prompt.1"),
     ({"2": {"class_type": "KSampler", "inputs": 1}}, "2.inputs"),
     ({"2": {"class_type": "KSampler"}}, "2.inputs")],
)  # fmt: skip
def test_post_plan_names_the_node_field_that_is_wrong(body: Any, setting: str) -> None:
    status, reply = api.post_plan(body, lambda p: pytest.fail("planned a non-workflow"))
    assert status == 400 and reply["setting"] == setting and reply["error"].startswith(setting)


def test_a_node_sent_without_its_type_is_named_as_one_the_frontend_could_not_build() -> None:
    # v0.3.64's frontend (1.27.10) sends a node it failed to build (a VAELoader, there) as
    # {"inputs": {"UNKNOWN": ...}, "class_type": null}: the user's fix is that node.
    body = {"prompt": {"10": {"inputs": {"UNKNOWN": "ae.safetensors"}, "class_type": None}}}
    status, reply = api.post_plan(body, lambda p: pytest.fail("planned a non-workflow"))
    assert status == 400 and reply["setting"] == "prompt.10.class_type"
    assert "could not build this node" in reply["error"]


def test_post_plan_turns_a_planner_error_into_a_400_naming_the_setting() -> None:
    def plan(prompt: dict[str, Any]) -> dict[str, Any]:
        raise errors.ConfigError("unet_name", "'m.safetensors' is not in models/diffusion_models")

    status, reply = api.post_plan(PROMPT, plan)
    assert status == 400 and reply["setting"] == "unet_name"


def test_budgets_round_trip_and_keep_the_other_settings(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    saved = settings_file.PanelSettings(quant_preset="int8-weight")
    settings_file.save_settings(saved, path)
    assert api.get_budgets(path)[1]["budgets"] == {"vram_gb": None, "ram_gb": None}
    status, reply = api.put_budgets({"vram_gb": "7.5", "ram_gb": 16}, path)
    assert status == 200 and reply["budgets"] == {"vram_gb": 7.5, "ram_gb": 16.0}
    loaded = settings_file.load_settings(path)
    assert (loaded.vram_budget, loaded.ram_budget) == (int(7.5 * GIB), 16 * GIB)
    assert loaded.quant_preset == "int8-weight"
    # The panel saving its policy keeps the budgets the sidebar set.
    settings_file.save_settings(settings_file.PanelSettings(), path)
    assert settings_file.load_settings(path).ram_budget == 16 * GIB
    assert json.loads(path.read_text())["budgets"]["ram_gb"] == 16.0
    # Empty clears a budget.
    api.put_budgets({"vram_gb": "", "ram_gb": None}, path)
    assert settings_file.load_settings(path).budgets == settings_file.Budgets()


@pytest.mark.parametrize(
    ("body", "setting"),
    [({"vram_gb": "-1"}, "vram_gb"), ({"ram_gb": "lots"}, "ram_gb"), ({"vram_gb": 1e308}, "vram_gb"),
     ({"disk_gb": 1}, "disk_gb"), ([], "budgets")],
)  # fmt: skip
def test_bad_budgets_are_refused_naming_them(tmp_path: Path, body: Any, setting: str) -> None:
    status, reply = api.put_budgets(body, tmp_path / "s.json")
    assert status == 400 and reply["setting"] == setting
    assert not (tmp_path / "s.json").exists()


LAYOUT_IDS = {"flux": 1, "t5": 2, "wan": 3}


def sample(title_name: str, bytes_disk: int, kind: str = "model", why: str | None = None) -> Any:
    kinds = importlib.import_module(f"{PACK_NAME}.offload_core.offload_kind")
    stats_dict = {"name": title_name, "kind": kind, "tier": "disk", "bytes_disk": bytes_disk,
                  "layout_id": LAYOUT_IDS.get(title_name, 9), "why": why}  # fmt: skip
    return monitor.OffloadSample(title_name, stats_dict, kinds.OffloadKind(kind))


def test_disk_reads_are_counted_per_prompt_and_network() -> None:
    prompt_reads.reset()
    model, te = sample("flux", 10 * GIB), sample("t5", 3 * GIB, "text_encoder")
    assert stats.offload_entry(model)["disk_read_last_prompt"] is None  # no prompt seen yet
    stats.observe_prompt("p1", [model, te])
    later = [sample("flux", 14 * GIB), sample("t5", 3 * GIB, "text_encoder"), sample("wan", GIB)]
    stats.observe_prompt("p1", later)  # the same prompt: the base stays
    entries = {e["name"]: e["disk_read_last_prompt"] for e in map(stats.offload_entry, later)}
    assert entries == {"flux": 4 * GIB, "t5": 0, "wan": GIB}  # wan laid out in this prompt
    stats.observe_prompt("p2", later)
    assert stats.offload_entry(later[0])["disk_read_last_prompt"] == 0
    text = "\n".join(report.offload_lines(later[0].stats))
    assert "read from disk this prompt: 0 B" in text  # units.fmt_bytes, as every amount
    prompt_reads.reset()


def test_the_planners_sentence_rides_on_the_line() -> None:
    flux = sample("flux", 0, why="disk: 23.8 GiB model flux, ...")
    entry = stats.offload_entry(flux)
    assert entry["why"] == "disk: 23.8 GiB model flux, ..."
    assert "  why: disk: 23.8 GiB" in "\n".join(report.offload_lines(flux.stats))
    assert stats.offload_entry(sample("other", 0))["why"] is None
