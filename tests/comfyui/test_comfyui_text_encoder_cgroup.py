"""A text encoder bigger than RAM in real ComfyUI (issue 29), under a cgroup memory limit
smaller than the encoder's file (1000 MB for 1.7 GB; ComfyUI itself holds about 400 MB):

    Ferry Load Text Encoder -> Ferry Offload Text Encoder (disk) -> CLIPTextEncode

completes inside the limit with conditioning ``torch.equal`` to CLIPLoader -> CLIPTextEncode
run without a limit; CLIPLoader -> CLIPTextEncode inside the same limit is killed.

The encoder is T5-XXL-shaped (core's classes, detected as T5_XXL by core's CLIPLoader type
sd3), about 1.7 GB of float16 with random weights (make_text_encoders.py --big). One core,
a few minutes on 2 CPU cores:

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_text_encoder_cgroup.py -s
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Server, comfy_checkout, limited_server, make_base, start_server, stop_server
from ferry_workflows import Client
from make_text_encoders import BIG_T5XXL_FILE
from test_comfyui_bigger_than_ram import RssAnonPeak
from test_comfyui_text_encoder import assert_equal, clip_graph, encode, ferry_te

from tests import cgroup_limit

MB = 1 << 20
LIMIT = 1000 * MB

pytestmark = pytest.mark.skipif(
    cgroup_limit.unavailable() is not None, reason=str(cgroup_limit.unavailable())
)


def big_graph(prefix: str, with_ferry: bool) -> dict[str, Any]:
    inputs = {"clip_name": BIG_T5XXL_FILE, "type": "sd3"}
    if not with_ferry:
        return clip_graph("CLIPLoader", inputs, prefix)
    ferry = ferry_te(tier="disk", prefetch_depth=1)
    return clip_graph("FerryLoadTextEncoder", inputs, prefix, ferry)


@pytest.fixture(scope="module")
def big_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-te-big")
    make_base(base, py, comfy, "make_text_encoders.py", "--big", timeout=900)
    assert (base / "models" / "text_encoders" / BIG_T5XXL_FILE).stat().st_size >= 1.5 * LIMIT
    return base


@pytest.fixture(scope="module")
def reference(big_base: Path) -> dict[str, torch.Tensor]:
    comfy, py = comfy_checkout()
    srv = start_server(comfy, py, big_base)
    try:
        return encode(Client(srv.url), srv, big_graph("plain-big", with_ferry=False))
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def limited(big_base: Path, reference: dict[str, torch.Tensor]) -> Iterator[Any]:
    with limited_server(big_base, LIMIT, "ferry-29-te") as served:
        yield served


def test_ferry_loader_encodes_a_text_encoder_bigger_than_the_limit(
    limited: Any, reference: dict[str, torch.Tensor]
) -> None:
    srv, group = limited
    rss = RssAnonPeak(srv.proc.pid)
    got = encode(Client(srv.url), srv, big_graph("ferry-big", with_ferry=True))
    peak = rss.stop()
    print(
        f"big T5 ({BIG_T5XXL_FILE}, {file_mb(srv)} MB) in a {LIMIT // MB} MB cgroup: "
        f"peak RssAnon {peak / MB:.0f} MB, cgroup peak {group.max_usage / MB:.0f} MB"
    )
    assert srv.proc.poll() is None
    assert_equal(got, reference)
    log = srv.log.read_text(errors="replace")
    assert "ferry: laid out" in log and "cannot stay in its file" not in log


def test_clip_loader_in_the_same_limit_is_killed(limited: Any) -> None:
    srv, _group = limited
    client = Client(srv.url)
    client.unload_models(within_s=30)
    status, _ = client.queue(big_graph("plain-limited", with_ferry=False))
    assert status == 200
    try:
        srv.proc.wait(timeout=300)
    except Exception:
        pytest.fail("CLIPLoader -> CLIPTextEncode survived a limit smaller than the file")
    assert srv.proc.returncode == -9, srv.log_tail()
    with pytest.raises(OSError):
        urllib.request.urlopen(srv.url + "/ferry/stats", timeout=5)


def file_mb(srv: Server) -> int:
    return (srv.base / "models" / "text_encoders" / BIG_T5XXL_FILE).stat().st_size // MB
