"""Issue 37's done-when in real ComfyUI: the whole graph (a text encoder and a diffusion model,
each through Ferry's loader and offload node with every setting on "auto") in three memory
cgroups gives the latent and image of the plain graph run without a limit, bit for bit:
- one where everything fits in RAM (auto keeps both in the RAM tier),
- one smaller than the two networks together (the text encoder, read once a prompt, goes to
  disk; the diffusion model, read every step, stays in RAM),
- one smaller than the diffusion model alone (both stream from disk).
The plain graph is killed in the last two. Each case prints the table row the docs keep: the
limit, each network's choice and its sentence, the pre-flight's predicted peak RAM against the
cgroup's measured peak (``memory.max_usage_in_bytes``).

The files: make_text_encoders.py --big --big-layers=36 (a 2.5 GB float16 T5-XXL-shaped
encoder) and make_whole_graph.py 16 (a 2.4 GB float32 SD3-shaped MMDiT), SD3's VAE.
``FERRY_PLANNER_BASE`` names a base folder with them already written (built once, reused):

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_planner_cgroups.py -s
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    HAS_AIMDO,
    comfy_checkout,
    limited_server,
    start_server,
    stop_server,
)
from ferry_workflows import Client
from test_comfyui_bigger_than_ram import RssAnonPeak
from whole_graph import FERRY_AUTO, PLAIN, make_graph_base, run_graph, whole_graph

from tests import cgroup_limit

MB = 1 << 20
GB = 1 << 30
DEPTH = 16  # the MMDiT: 2.4 GB of float32, about the T5's size


@dataclass(frozen=True)
class Case:
    name: str
    limit: int
    tiers: dict[str, str]  # kind -> the tier auto must choose
    plain_killed: bool
    #: The diffusion model through core's UNETLoader (whole in RAM before Ferry's node runs):
    #: its bytes count back as available, or the plan would see them twice.
    core_loader: bool = False


CASES = [
    Case("everything-fits", 9 * GB, {"text_encoder": "ram", "model": "ram"}, False),
    Case("one-to-disk", 4608 * MB, {"text_encoder": "disk", "model": "ram"}, True),
    Case("smaller-than-the-model", 2200 * MB, {"text_encoder": "disk", "model": "disk"}, True),
    Case("core-loader", 4608 * MB, {"text_encoder": "disk", "model": "ram"}, False, True),
]


def auto_graph(case: Case) -> dict[str, Any]:
    g = whole_graph(FERRY_AUTO, f"planner-{case.name}")
    if case.core_loader:
        g["2"] = {"class_type": "UNETLoader", "inputs": {"unet_name": g["2"]["inputs"]["unet_name"],
                                                          "weight_dtype": "default"}}  # fmt: skip
    return g


pytestmark = pytest.mark.skipif(
    cgroup_limit.unavailable() is not None, reason=str(cgroup_limit.unavailable())
)


@pytest.fixture(scope="module")
def graph_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("FERRY_PLANNER_BASE")
    if given and (Path(given) / "models").is_dir():
        return Path(given)
    base = tmp_path_factory.mktemp("comfy-planner-graph")
    make_graph_base(base, DEPTH)
    return base


@pytest.fixture(scope="module")
def reference(graph_base: Path) -> dict[str, torch.Tensor]:
    comfy, py = comfy_checkout()
    srv = start_server(comfy, py, graph_base)
    try:
        return run_graph(srv, whole_graph(PLAIN, "planner-plain"))
    finally:
        stop_server(srv)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_auto_in_a_cgroup(graph_base: Path, reference: dict[str, torch.Tensor], case: Case) -> None:
    if case.core_loader and not HAS_AIMDO:
        # Measured on v0.3.64: killed in 4.5 GiB; in 9 GiB the server's RssAnon peaked at
        # 6.83 GiB against the 5.6 GiB planned. The plan does not count what core's UNETLoader
        # holds on top while it loads there (facts.md: 2.1x the file); v0.33 loads lazily.
        pytest.skip(
            "this core's UNETLoader peaks above the plan: not modelled (docs/benchmarks.md)"
        )
    g = auto_graph(case)
    with limited_server(graph_base, case.limit, f"ferry-37-{case.name}") as (srv, group):
        client = Client(srv.url)
        status, plan = client.post("/ferry/plan", {"prompt": g})
        assert status == 200, plan
        rss = RssAnonPeak(srv.proc.pid)
        got = run_graph(srv, g)
        anon = rss.stop()  # the process's own memory: what a kill is about
        measured = group.max_usage  # with the page cache the kernel reclaims first
        lines = {line["kind"]: line for line in client.live()}
        for k in reference:
            assert torch.equal(got[k], reference[k]), f"{k}: {(got[k] - reference[k]).abs().max()}"
        chosen = {n["kind"]: n for n in plan["networks"] if n["kind"] != "vae"}
        predicted = plan["peak_ram"]
        print(f"\n| {case.limit / GB:.2f} GiB | {case.name} | predicted {predicted / GB:.2f} GiB"
              f" | RssAnon peak {anon / GB:.2f} GiB ({(predicted - anon) / anon:+.0%}) | cgroup"
              f" peak {measured / GB:.2f} GiB ({(predicted - measured) / measured:+.0%}) |")  # fmt: skip
        for kind, n in chosen.items():
            print(f"|   {kind} | {n['tier']} | {n['reason']} |")
        if case.core_loader:  # the node's own plan (the pre-flight ran before the loader)
            log = srv.log.read_text(errors="replace")
            assert "ferry plan: model ferry-graph-sd3 (12): ram: " in log, srv.log_tail()
        assert {k: n["tier"] for k, n in chosen.items()} == case.tiers
        # The pre-flight's peak against the process's own memory (the cgroup's peak also holds
        # page cache the kernel reclaims before a kill: docs/benchmarks.md says by how much).
        assert abs(predicted - anon) / anon < 0.15, (predicted, anon)
        assert {k: lines[k]["tier"] for k in case.tiers} == case.tiers  # the layout as planned
        assert all(lines[k]["why"] for k in case.tiers)
        if case.plain_killed:
            client.unload_models(within_s=60)
            assert client.queue(whole_graph(PLAIN, f"plain-{case.name}"))[0] == 200
            try:
                srv.proc.wait(timeout=900)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the plain graph survived the {case.name} limit")
            assert srv.proc.returncode == -9, srv.log_tail()
