"""An all-in-one checkpoint bigger than the memory limit in real ComfyUI (issue 48):

    Ferry Load Checkpoint -> Ferry Offload Model (disk) ------------------> KSampler -> VAEDecode
                          -> Ferry Offload Text Encoder (disk) -> CLIPTextEncode -^
                          -> VAE -----------------------------------------------------^

in a memory cgroup smaller than the file gives the latent and the image ``torch.equal`` to
CheckpointLoaderSimple's graph run without a limit; CheckpointLoaderSimple in the same limit is
killed. Two files (make_checkpoint_models.py: SDXL-shaped, core's classes and keys, random
weights): everything float16 (6.9 GB), and the same with the diffusion model in float8_e4m3fn
(4.4 GB, an "fp8 all-in-one" file).

Core on a CPU builds SDXL in float32 (it fits the machine's RAM), which no user with a GPU gets
and which would make a 10 GB model of a 5 GB one: the servers run with --fp16-unet (the fp8
file with --fp8_e4m3fn-unet), the dtypes core picks on a GPU short of VRAM, both graphs alike.

The files are written once (about 5 minutes) into $FERRY_CHECKPOINT_CACHE when it is set and
reused, as is each unlimited reference (a 64x64 image, one step):

    FERRY_CHECKPOINT_CACHE=/work/scratch/ckpt48 FERRY_COMFYUI=/work/comfy/v0.33.0 \\
        python -m pytest tests/comfyui/test_comfyui_checkpoint_cgroup.py -s
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Server, comfy_checkout, make_base, start_server, stop_server
from ferry_workflows import Client, error_message, ferry
from make_checkpoint_models import CACHE_ENV, CKPT_FILE, FP8_FILE
from test_comfyui_bigger_than_ram import RssAnonPeak
from whole_graph import outputs

from tests import cgroup_limit

MB = 1 << 20
TEXT = "a ferry crossing a wide river at dawn, oil painting"

pytestmark = pytest.mark.skipif(
    cgroup_limit.unavailable() is not None, reason=str(cgroup_limit.unavailable())
)


@dataclass(frozen=True)
class Case:
    name: str
    file: str
    args: tuple[str, ...]  # the unet dtype core would pick on a GPU (see above)
    limit: int  # below the file's size and below what core's load of it holds


#: Ferry's run of the float16 file peaked at 3429 MB RssAnon on v0.33 (ComfyUI itself, the VAE in
#: float32, the text encoders' tensors kept in RAM, two 775 MB groups of the diffusion model);
#: core's load holds the file's 6.6 GB (4.2 GB for the fp8 one) and more.
CASES = (
    Case("fp16", CKPT_FILE, ("--fp16-unet",), 4000 * MB),
    Case("fp8", FP8_FILE, ("--fp8_e4m3fn-unet",), 3500 * MB),
)


def checkpoint_graph(ckpt: str, ferry_nodes: bool, prefix: str) -> dict[str, Any]:
    """The API-format workflow: the latent saved as ``<prefix>`` (SaveLatent), the image as
    output/<prefix>-image.safetensors (whole_graph.outputs reads both)."""
    loader = "FerryLoadCheckpoint" if ferry_nodes else "CheckpointLoaderSimple"
    g: dict[str, Any] = {"1": {"class_type": loader, "inputs": {"ckpt_name": ckpt}}}
    model, clip = ["1", 0], ["1", 1]
    if ferry_nodes:
        widgets = ferry(tier="disk")[1]
        g["11"] = {"class_type": "FerryOffloadModel", "inputs": {"model": model, **widgets}}
        g["12"] = {"class_type": "FerryOffloadTextEncoder", "inputs": {"clip": clip, **widgets}}
        model, clip = ["11", 0], ["12", 0]
    g["3"] = {"class_type": "CLIPTextEncode", "inputs": {"text": TEXT, "clip": clip}}
    g["4"] = {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": clip}}
    g["5"] = {"class_type": "EmptyLatentImage",
              "inputs": {"width": 64, "height": 64, "batch_size": 1}}  # fmt: skip
    g["6"] = {
        "class_type": "KSampler",
        "inputs": {
            "model": model, "positive": ["3", 0], "negative": ["4", 0], "latent_image": ["5", 0],
            "seed": 7, "steps": 1, "cfg": 5.0, "sampler_name": "euler", "scheduler": "normal",
            "denoise": 1.0,
        },
    }  # fmt: skip
    g["7"] = {
        "class_type": "SaveLatent",
        "inputs": {"samples": ["6", 0], "filename_prefix": prefix},
    }
    g["9"] = {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["1", 2]}}
    g["10"] = {
        "class_type": "FerryTestSaveImage",
        "inputs": {"images": ["9", 0], "filename_prefix": f"{prefix}-image"},
    }
    return g


def run(srv: Server, g: dict[str, Any]) -> dict[str, torch.Tensor]:
    try:
        entry = Client(srv.url).run(g, timeout=1800)
    except OSError as e:  # the server is gone
        srv.proc.wait(timeout=60)
        raise AssertionError(
            f"ComfyUI died ({e}; exit {srv.proc.returncode}):\n{srv.log_tail()}"
        ) from e
    assert entry["status"]["status_str"] == "success", f"{error_message(entry)}\n{srv.log_tail()}"
    return outputs(srv.base, entry, g["7"]["inputs"]["filename_prefix"])


@pytest.fixture(scope="module")
def ckpt_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-ckpt")
    make_base(base, py, comfy, "make_checkpoint_models.py", timeout=3600)
    for case in CASES:
        size = (base / "models" / "checkpoints" / case.file).stat().st_size
        assert size > case.limit, (case.file, size)
    assert (base / "models" / "checkpoints" / CKPT_FILE).stat().st_size >= 6 * 10**9
    return base


def _reference_path(case: Case) -> Path | None:
    cache = os.environ.get(CACHE_ENV)
    if not cache:
        return None
    comfy, _ = comfy_checkout()
    return Path(cache) / f"reference-{comfy.name}-{case.name}.pt"


def reference(base: Path, case: Case) -> dict[str, torch.Tensor]:
    """CheckpointLoaderSimple's latent and image without a limit (cached where it can be)."""
    path = _reference_path(case)
    if path is not None and path.exists():
        return dict(torch.load(path))
    comfy, py = comfy_checkout()
    srv = start_server(comfy, py, base, args=case.args)
    try:
        out = run(srv, checkpoint_graph(case.file, False, f"plain-{case.name}"))
    finally:
        stop_server(srv)
    for k, v in out.items():
        assert torch.isfinite(v).all() and v.abs().sum() > 0, f"plain {k} says nothing"
    if path is not None:
        torch.save(out, path)
    return out


@contextlib.contextmanager
def limited(base: Path, case: Case) -> Iterator[tuple[Server, Any]]:
    comfy, py = comfy_checkout()
    group = cgroup_limit.MemoryGroup(case.limit, name=f"ferry-48-{case.name}")
    srv = start_server(comfy, py, base, preexec_fn=group.enter, args=case.args)
    try:
        yield srv, group
    finally:
        stop_server(srv)
        group.remove()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_ferry_load_checkpoint_runs_a_checkpoint_bigger_than_the_limit(
    ckpt_base: Path, case: Case
) -> None:
    want = reference(ckpt_base, case)
    with limited(ckpt_base, case) as (srv, group):
        rss = RssAnonPeak(srv.proc.pid)
        got = run(srv, checkpoint_graph(case.file, True, f"ferry-{case.name}"))
        peak = rss.stop()
        size = (ckpt_base / "models" / "checkpoints" / case.file).stat().st_size
        print(
            f"{case.file} ({size // MB} MB) in a {case.limit // MB} MB cgroup: peak RssAnon "
            f"{peak / MB:.0f} MB, cgroup peak {group.max_usage / MB:.0f} MB"
        )
        assert srv.proc.poll() is None
        for k in want:
            assert torch.equal(got[k], want[k]), f"{k}: {(got[k] - want[k]).abs().max()}"
        log = srv.log.read_text(errors="replace")
        assert log.count("ferry: laid out") >= 2, "the model and the text encoders laid out"
        assert "cannot stay in its file" not in log

        # CheckpointLoaderSimple in the same limit: killed.
        client = Client(srv.url)
        client.unload_models(within_s=60)
        status, _ = client.queue(checkpoint_graph(case.file, False, f"plain-limited-{case.name}"))
        assert status == 200
        try:
            srv.proc.wait(timeout=900)
        except subprocess.TimeoutExpired:
            pytest.fail("CheckpointLoaderSimple survived a limit smaller than its checkpoint")
        assert srv.proc.returncode == -9, srv.log_tail()
