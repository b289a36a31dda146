"""A re-layout or a release never holds a network twice (issue 42), in real ComfyUI inside a
memory cgroup of 1.3x the plain run's peak RssAnon:

    CLIPLoader -> Ferry Offload Text Encoder -> CLIPTextEncode -+-> KSampler -> SaveLatent
    UNETLoader -> Ferry Offload Model ---------------------------'       (-> VAEDecode)

run with both Ferry nodes on ram, then disk, then pinned (block level; the same loaded CLIP and
MODEL each time: core's loaders stay cached, so each step re-lays the same networks out), then
the same files through new core loaders without Ferry, which makes ComfyUI drop the Ferry
patchers: each step's latent and image ``torch.equal`` to the plain graph's, nothing killed,
each step's peak printed. The files are the whole graph's (whole_graph.py: a 2.3-2.5 GB float16
T5-XXL-shaped encoder, a 0.6 GB float32 MMDiT, SD3's VAE). Before the change a re-layout from
ram held the restored network beside the old slabs, and the last step read the pinned layout
back for a patcher being discarded.

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_relayout_cgroup.py -s
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import comfy_checkout, limited_server, start_server, stop_server
from ferry_workflows import Client, ferry
from make_text_encoders import BIG_T5XXL_FILE
from make_whole_graph import MODEL_FILE
from test_comfyui_bigger_than_ram import RssAnonPeak
from whole_graph import PLAIN, make_graph_base, run_graph, whole_graph

from tests import cgroup_limit

MB = 1 << 20
#: The limit, as a multiple of the plain sequence's peak RssAnon (FERRY_RELAYOUT_HEADROOM: to
#: see each step's peak without the limit biting, say 3).
HEADROOM = float(os.environ.get("FERRY_RELAYOUT_HEADROOM", "1.3"))
STEPS = ("ram", "disk", "pinned")

pytestmark = pytest.mark.skipif(
    cgroup_limit.unavailable() is not None, reason=str(cgroup_limit.unavailable())
)


def step_graph(tier: str | None, prefix: str, reload: bool = False) -> dict[str, Any]:
    """The whole graph with core's loaders, each network through its Ferry offload node on
    ``tier`` (None: no Ferry node). ``reload``: the same bytes loaded anew, by loaders whose
    inputs differ (ComfyUI keys its cache by a node's inputs, so the same inputs under another
    node id would hand back the cached CLIP and MODEL): CLIPLoader's device "cpu" (where it
    loads anyway on this CPU) and the diffusion model's file under a second name (a hard
    link). The old loaders' outputs are dropped when the prompt starts."""
    g = whole_graph(PLAIN, prefix)
    if reload:
        g["1"]["inputs"]["device"] = "cpu"
        g["2"]["inputs"]["unet_name"] = MODEL_AGAIN
    clip, model = ["1", 0], ["2", 0]
    if tier is not None:
        g["11"] = {"class_type": "FerryOffloadTextEncoder",
                   "inputs": {"clip": clip, **ferry(tier=tier, blocks_per_group=2)[1]}}  # fmt: skip
        g["12"] = {"class_type": "FerryOffloadModel",
                   "inputs": {"model": model, **ferry(tier=tier, blocks_per_group=2)[1]}}  # fmt: skip
        clip, model = ["11", 0], ["12", 0]
    g["3"]["inputs"]["clip"] = clip
    g["6"]["inputs"]["model"] = model
    return g


#: The plain sequence: core's loaders, then the same files loaded anew (the old outputs
#: dropped), as the Ferry sequence ends.
PLAIN_STEPS = (("plain", False), ("plain-reloaded", True))
#: The diffusion model's file under a second name (a hard link: the same bytes).
MODEL_AGAIN = MODEL_FILE.replace(".safetensors", "-again.safetensors")


@pytest.fixture(scope="module")
def graph_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("comfy-relayout")
    make_graph_base(base)
    models = base / "models" / "diffusion_models"
    (models / MODEL_AGAIN).hardlink_to(models / MODEL_FILE)
    return base


@pytest.fixture(scope="module")
def plain(graph_base: Path) -> tuple[dict[str, torch.Tensor], int]:
    """The plain graph's outputs and the plain sequence's peak RssAnon, without a limit."""
    comfy, py = comfy_checkout()
    srv = start_server(comfy, py, graph_base)
    try:
        rss = RssAnonPeak(srv.proc.pid)
        outs = [run_graph(srv, step_graph(None, name, reload)) for name, reload in PLAIN_STEPS]
        peak = rss.stop()
    finally:
        stop_server(srv)
    for k in outs[0]:
        assert torch.equal(outs[0][k], outs[1][k]), f"plain {k} differs between loads"
    print(f"plain sequence: peak RssAnon {peak / MB:.0f} MB")
    return outs[0], peak


@pytest.fixture(scope="module")
def limited(graph_base: Path, plain: tuple[dict[str, torch.Tensor], int]) -> Iterator[Any]:
    limit = int(HEADROOM * plain[1])
    with limited_server(graph_base, limit, "ferry-42-relayout") as served:
        yield served


def assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], step: str) -> None:
    for k, v in want.items():
        assert torch.equal(got[k], v), f"{step}: {k} differs from the plain graph's"


def test_relayouts_and_a_discard_stay_inside_the_limit(
    limited: Any, plain: tuple[dict[str, torch.Tensor], int]
) -> None:
    srv, group = limited
    want, plain_peak = plain
    rows = []
    log_at = 0
    for tier in (*STEPS, None):
        step = tier or "plain load of the same files"
        group.reset_peak()
        rss = RssAnonPeak(srv.proc.pid)
        if tier is None:
            got = run_graph(srv, step_graph(None, "after-ferry", reload=True))
        else:
            got = run_graph(srv, step_graph(tier, f"ferry-{tier}"))
        peak = rss.stop()
        assert srv.proc.poll() is None, f"killed at step {step}:\n{srv.log_tail()}"
        assert_equal(got, want, step)
        log = srv.log.read_text(errors="replace")
        new, log_at = log[log_at:], len(log)
        rows.append((step, peak, group.max_usage, new))
        print(f"{step}: peak RssAnon {peak / MB:.0f} MB, cgroup peak {group.max_usage / MB:.0f} MB")
    for step, peak, cg, _ in rows:
        print(
            f"{step:>28}: peak RssAnon {peak / MB:6.0f} MB ({peak / plain_peak:.2f}x plain), "
            f"cgroup peak {cg / MB:6.0f} MB of {group.limit / MB:.0f} MB"
        )
    # Each re-layout gave the old layout's weights back (the next one starts from the plain
    # network); the last step dropped both layouts without reading them back.
    for step, _, _, new in rows[1:3]:
        assert new.count("(weights given back)") >= 2, f"{step}: no re-layout in the log\n{new}"
    last = rows[3][3]
    assert last.count("(discarded, nothing read back)") == 2, last
    assert "(weights given back)" not in last, last
    assert not Client(srv.url).live(), "a layout outlived its discarded patchers"


def test_the_files_are_the_whole_graphs(graph_base: Path) -> None:
    te = graph_base / "models" / "text_encoders" / BIG_T5XXL_FILE
    unet = graph_base / "models" / "diffusion_models" / MODEL_FILE
    assert te.stat().st_size > 2000 * MB and unet.stat().st_size > 500 * MB


def test_a_discarded_disk_layout_is_not_read(
    limited: Any, plain: tuple[dict[str, torch.Tensor], int]
) -> None:
    """Both networks on the disk tier, read in place from their unchanged files (issue 48:
    core's loaders' files, so no group file is written; a damaged group file's release is
    test_comfyui_faults.py's and test_comfyui_recovery.py's, with a cast model); the files
    loaded anew: a discard reads nothing back and deletes Ferry's folders. Runs after the
    sequence above, in the same server."""
    srv, _group = limited
    want, _ = plain
    client = Client(srv.url)
    assert_equal(run_graph(srv, step_graph("disk", "ferry-disk-again", reload=True)), want, "disk")
    folders = [Path(o["disk_folder"]) for o in client.live()]
    assert len(folders) == 2, client.live()
    written = [f for folder in folders for f in folder.glob("group-*.safetensors")]
    assert written == [], f"an unchanged network's groups were written: {written}"
    assert srv.log.read_text(errors="replace").count("read in place from") >= 2
    log_at = len(srv.log.read_text(errors="replace"))
    assert_equal(run_graph(srv, step_graph(None, "after-disk", reload=False)), want, "plain")
    new = srv.log.read_text(errors="replace")[log_at:]
    assert new.count("(discarded, nothing read back)") == 2, new
    assert "restoring group" not in new and "damaged" not in new, new
    assert not any(f.exists() for f in folders), "a discarded layout's folder was left behind"
