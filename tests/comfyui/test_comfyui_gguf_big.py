"""A GGUF model bigger than the memory limit, in real ComfyUI with the real ComfyUI-GGUF:
UnetLoaderGGUF -> Ferry Offload Model (disk tier) -> KSampler inside a cgroup of less than
half the .gguf completes with the latent of the same graph without Ferry and without a limit,
and the disk tier reads the groups from the .gguf itself (nothing written to Ferry's folder).
Opt-in: FERRY_COMFYUI, FERRY_COMFYUI_GGUF, and root for the cgroup. About 6 minutes here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Server, comfy_checkout, limited_server, start_server, stop_server
from ferry_workflows import Client, ferry, graph
from test_comfyui_bigger_than_ram import RssAnonPeak, _free, _run
from test_comfyui_gguf import COND, GGUF_PACK, LATENT, gguf_base

from tests import cgroup_limit

MB = 1 << 20
LIMIT = 750 * MB
LAYERS = 90  # 1024-wide Wan 2.1 blocks in Q8_0: a 1.63 GB file, more than twice the limit
MODEL = "ferry-big-wan-q8_0.gguf"

pytestmark = [
    pytest.mark.skipif(not GGUF_PACK, reason="set FERRY_COMFYUI_GGUF to run the GGUF suite"),
    pytest.mark.skipif(
        cgroup_limit.unavailable() is not None, reason=str(cgroup_limit.unavailable())
    ),
]


def _graph(with_ferry: bool, name: str) -> dict[str, Any]:
    chain = [ferry(tier="disk", level="block")] if with_ferry else []
    loader = ("UnetLoaderGGUF", {"unet_name": MODEL})
    return graph(chain, name, loader=loader, latent=LATENT, cond=COND["wan"], steps=2)


@pytest.fixture(scope="module")
def big_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = gguf_base(tmp_path_factory.mktemp("comfy-gguf-big"), "--big", str(LAYERS))
    assert (base / "models" / "diffusion_models" / MODEL).stat().st_size >= 2 * LIMIT
    return base


@pytest.fixture(scope="module")
def reference(big_base: Path) -> torch.Tensor:
    comfy, py = comfy_checkout()
    srv = start_server(comfy, py, big_base)
    try:
        return _run(srv, _graph(False, "plain-big"))
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def limited(big_base: Path, reference: torch.Tensor) -> Iterator[tuple[Server, Any]]:
    with limited_server(big_base, LIMIT, "ferry-28-gguf") as served:
        yield served


def test_a_gguf_bigger_than_the_limit_runs_through_the_disk_tier(
    limited: tuple[Server, Any], reference: torch.Tensor
) -> None:
    srv, group = limited
    rss = RssAnonPeak(srv.proc.pid)
    latent = _run(srv, _graph(True, "ferry-big"))
    peak = rss.stop()
    (o,) = Client(srv.url).get("/ferry/stats")["offloads"]
    folder = Path(o["disk_folder"])
    written = sorted(p.name for p in folder.rglob("group-*")) if folder.exists() else []
    print(
        f"GGUF {LAYERS} blocks in a {LIMIT // MB} MB cgroup: peak RssAnon {peak / MB:.0f} MB, "
        f"cgroup peak {group.max_usage / MB:.0f} MB, group files written: {len(written)}"
    )
    assert srv.proc.poll() is None
    assert torch.equal(latent, reference)
    assert written == [], "unchanged GGUF groups are read from the .gguf, never copied"
    assert o["bytes_moved"] > 0 and o["tier"] == "disk"
    _free(srv)
