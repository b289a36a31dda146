"""Wan 2.2's files bigger than RAM (issue 40), in real ComfyUI under a cgroup memory limit:
two ``fp8_scaled`` experts and an ``fp8_scaled`` T5, built with core's classes
(make_quant_models.py --big), the files together larger than the limit and the limit smaller
than one expert plus the text encoder:

    Ferry Load Text Encoder -> Ferry Offload Text Encoder (disk) -> CLIPTextEncode -> saved
    Ferry Load Diffusion Model (high) -> Ferry Offload Model (disk) -> KSamplerAdvanced 0..1
    Ferry Load Diffusion Model (low)  -> Ferry Offload Model (disk) -> KSamplerAdvanced 1..2

runs inside the limit, its latent and conditioning ``torch.equal`` to core's loaders
(UNETLoader x2, CLIPLoader) without a limit; core's graph inside the same limit is killed.
The experts sample from the test conditioning (Wan reads 4096-wide text; the test T5 is 1024
wide), the T5's own conditioning is saved and compared beside the latent.

And a dual load whose smaller file is bigger than the limit's headroom (a 400 MB CLIP-L beside
the T5, DualCLIPLoader type flux): Ferry Load Text Encoders (dual) -> Ferry Offload Text Encoder
(disk) streams both files inside the limit; before issue 40 the smaller file was read whole.

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_core_quant_cgroup.py -s
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    Server,
    comfy_checkout,
    limited_server,
    make_base,
    run_maker,
    start_server,
    stop_server,
)
from ferry_workflows import Client, error_message, ferry, saved_latent_name
from make_quant_models import BIG_CLIP_L_FILE
from safetensors.torch import load_file
from test_comfyui_bigger_than_ram import RssAnonPeak
from test_comfyui_text_encoder import assert_equal

from tests import cgroup_limit

MB = 1 << 20
LIMIT = 1000 * MB
#: The dual load's limit: ComfyUI itself holds about 420 MB here (RssAnon, idle), so its
#: headroom (about 680 MB) is below the smaller file, the CLIP-L (about 950 MB of float16, the
#: dtype core builds it in on a CPU), which was read whole beside the streamed T5 before.
DUAL_LIMIT = 1100 * MB
EXPERT_MB = 560
OFF_EXTRA: dict[str, Any] = {}
HIGH, LOW = "ferry-q-wan-big-high.safetensors", "ferry-q-wan-big-low.safetensors"
T5 = "ferry-q-t5-big-fp8scaled.safetensors"
LATENT = ("EmptyHunyuanLatentVideo", {"width": 32, "height": 32, "length": 1, "batch_size": 1})
TEXT = "a ferry crossing a wide river at dawn, oil painting"

pytestmark = pytest.mark.skipif(
    cgroup_limit.unavailable() is not None, reason=str(cgroup_limit.unavailable())
)


def wan22_graph(prefix: str, with_ferry: bool, seed: int = 3) -> dict[str, Any]:
    off = ferry(tier="disk", prefetch_depth=1, **OFF_EXTRA)[1]
    g: dict[str, Any] = {}

    def model(nid: str, name: str) -> list[Any]:
        if not with_ferry:
            g[nid] = {"class_type": "UNETLoader",
                      "inputs": {"unet_name": name, "weight_dtype": "default"}}  # fmt: skip
            return [nid, 0]
        g[nid] = {"class_type": "FerryLoadDiffusionModelQuantized",
                  "inputs": {"unet_name": name, "quant_preset": "none", "cache": False,
                             "weight_dtype": "default"}}  # fmt: skip
        g[nid + "0"] = {"class_type": "FerryOffloadModel", "inputs": {"model": [nid, 0], **off}}
        return [nid + "0", 0]

    high, low = model("1", HIGH), model("2", LOW)
    loader = "FerryLoadTextEncoder" if with_ferry else "CLIPLoader"
    g["30"] = {"class_type": loader, "inputs": {"clip_name": T5, "type": "sd3"}}
    clip = ["30", 0]
    if with_ferry:
        g["31"] = {"class_type": "FerryOffloadTextEncoder", "inputs": {"clip": clip, **off}}
        clip = ["31", 0]
    g["32"] = {"class_type": "CLIPTextEncode", "inputs": {"text": TEXT, "clip": clip}}
    g["33"] = {"class_type": "FerryTestSaveConditioning",
               "inputs": {"conditioning": ["32", 0], "filename_prefix": prefix + "-cond"}}  # fmt: skip
    g["3"] = {"class_type": "FerryTestConditioning", "inputs": {"seed": 1, "dim": 4096}}
    g["4"] = {"class_type": "FerryTestConditioning", "inputs": {"seed": 2, "dim": 4096}}
    g["5"] = {"class_type": LATENT[0], "inputs": LATENT[1]}
    common = {"positive": ["3", 0], "negative": ["4", 0], "noise_seed": seed, "steps": 2,
              "cfg": 2.0, "sampler_name": "euler", "scheduler": "simple"}  # fmt: skip
    g["6"] = {"class_type": "KSamplerAdvanced",
              "inputs": {**common, "model": high, "latent_image": ["5", 0], "add_noise": "enable",
                         "start_at_step": 0, "end_at_step": 1,
                         "return_with_leftover_noise": "enable"}}  # fmt: skip
    g["7"] = {"class_type": "KSamplerAdvanced",
              "inputs": {**common, "model": low, "latent_image": ["6", 0], "add_noise": "disable",
                         "start_at_step": 1, "end_at_step": 2,
                         "return_with_leftover_noise": "disable"}}  # fmt: skip
    g["8"] = {
        "class_type": "SaveLatent",
        "inputs": {"samples": ["7", 0], "filename_prefix": prefix},
    }
    return g


def dual_graph(prefix: str, with_ferry: bool) -> dict[str, Any]:
    inputs = {"clip_name1": BIG_CLIP_L_FILE, "clip_name2": T5, "type": "flux"}
    g: dict[str, Any] = {}
    g["1"] = {"class_type": "FerryLoadTextEncoderDual" if with_ferry else "DualCLIPLoader",
              "inputs": inputs}  # fmt: skip
    clip = ["1", 0]
    if with_ferry:
        g["2"] = {"class_type": "FerryOffloadTextEncoder",
                  "inputs": {"clip": clip, **ferry(tier="disk", prefetch_depth=1)[1]}}  # fmt: skip
        clip = ["2", 0]
    g["3"] = {"class_type": "CLIPTextEncode", "inputs": {"text": TEXT, "clip": clip}}
    g["4"] = {"class_type": "FerryTestSaveConditioning",
              "inputs": {"conditioning": ["3", 0], "filename_prefix": prefix + "-cond"}}  # fmt: skip
    return g


def outputs(srv: Server, g: dict[str, Any], timeout: float = 1200) -> dict[str, torch.Tensor]:
    entry = Client(srv.url).run(g, timeout=timeout)
    assert entry["status"]["status_str"] == "success", f"{error_message(entry)}\n{srv.log_tail()}"
    out: dict[str, torch.Tensor] = {}
    for node in g.values():
        prefix = node["inputs"].get("filename_prefix")
        if node["class_type"] == "FerryTestSaveConditioning":
            out.update(load_file(str(srv.base / "output" / f"{prefix}.safetensors")))
        elif node["class_type"] == "SaveLatent":
            path = srv.base / "output" / saved_latent_name(entry)
            out["latent"] = load_file(str(path))["latent_tensor"]
    return out


@pytest.fixture(scope="module")
def big_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-quant-big")
    make_base(base, py, comfy, "make_text_encoders.py", "--big", timeout=900)
    run_maker(base, py, comfy, "make_quant_models.py", "--big", str(EXPERT_MB), timeout=1800)
    (base / "models" / "text_encoders" / "ferry-big-t5xxl.safetensors").unlink()  # fp16 one
    return base


def size(base: Path, folder: str, name: str) -> int:
    return (base / "models" / folder / name).stat().st_size


@pytest.fixture(scope="module")
def reference(big_base: Path) -> dict[str, dict[str, torch.Tensor]]:
    comfy, py = comfy_checkout()
    srv = start_server(comfy, py, big_base)
    try:
        return {
            "wan22": outputs(srv, wan22_graph("plain-wan22", with_ferry=False)),
            "dual": outputs(srv, dual_graph("plain-dual", with_ferry=False)),
        }
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def limited(big_base: Path, reference: Any) -> Iterator[Any]:
    with limited_server(big_base, LIMIT, "ferry-40-quant") as served:
        yield served


@pytest.fixture
def dual_limited(big_base: Path, reference: Any) -> Iterator[Any]:
    with limited_server(big_base, DUAL_LIMIT, "ferry-40-dual") as served:
        yield served


def test_wan22_fp8_scaled_graph_runs_inside_a_limit_smaller_than_expert_and_encoder(
    big_base: Path, limited: Any, reference: dict[str, dict[str, torch.Tensor]]
) -> None:
    expert = size(big_base, "diffusion_models", HIGH)
    t5 = size(big_base, "text_encoders", T5)
    total = 2 * expert + t5
    assert total > LIMIT and expert + t5 > LIMIT, (expert, t5)
    srv, group = limited
    rss = RssAnonPeak(srv.proc.pid)
    got = outputs(srv, wan22_graph("ferry-wan22", with_ferry=True))
    peak = rss.stop()
    print(
        f"\nWan 2.2-shaped fp8_scaled graph: experts 2 x {expert / MB:.0f} MB, T5 {t5 / MB:.0f} "
        f"MB (files {total / MB:.0f} MB) in a {LIMIT // MB} MB cgroup: peak RssAnon "
        f"{peak / MB:.0f} MB, cgroup peak {group.max_usage / MB:.0f} MB"
    )
    assert srv.proc.poll() is None
    assert_equal(got, reference["wan22"])
    log = srv.log.read_text(errors="replace")
    assert "cannot stay in its file" not in log and "loading it whole" not in log
    assert log.count("stays in its file") >= 2 and "stay in their files" in log


def test_core_loaders_in_the_same_limit_are_killed(limited: Any) -> None:
    srv, _group = limited
    client = Client(srv.url)
    client.unload_models(within_s=30)
    status, _ = client.queue(wan22_graph("plain-limited", with_ferry=False, seed=4))
    assert status == 200
    try:
        srv.proc.wait(timeout=600)
    except Exception:
        pytest.fail("core's Wan 2.2 graph survived a limit smaller than expert + encoder")
    assert srv.proc.returncode == -9, srv.log_tail()
    with pytest.raises(OSError):
        urllib.request.urlopen(srv.url + "/ferry/stats", timeout=5)


def test_dual_load_streams_both_files(
    big_base: Path, dual_limited: Any, reference: dict[str, dict[str, torch.Tensor]]
) -> None:
    srv, group = dual_limited
    clip_l = size(big_base, "text_encoders", BIG_CLIP_L_FILE)
    idle = RssAnonPeak(srv.proc.pid)
    time.sleep(1)
    base_rss = idle.stop()
    print(f"\nComfyUI idle in the dual limit: RssAnon {base_rss / MB:.0f} MB")
    assert clip_l > DUAL_LIMIT - base_rss, "the smaller file must not fit in the headroom"
    rss = RssAnonPeak(srv.proc.pid)
    got = outputs(srv, dual_graph("ferry-dual", with_ferry=True))
    peak = rss.stop()
    print(
        f"\ndual load: CLIP-L {clip_l / MB:.0f} MB + T5 {size(big_base, 'text_encoders', T5) / MB:.0f}"
        f" MB in a {DUAL_LIMIT // MB} MB cgroup: peak RssAnon {peak / MB:.0f} MB, cgroup peak "
        f"{group.max_usage / MB:.0f} MB"
    )
    assert srv.proc.poll() is None
    assert_equal(got, reference["dual"])
