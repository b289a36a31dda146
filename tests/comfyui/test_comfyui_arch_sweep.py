"""Every architecture core runs, through Ferry (issue 28): the latents of

1. ``UNETLoader -> KSampler`` (plain),
2. ``UNETLoader -> Ferry Offload Model -> KSampler`` and
3. ``Ferry Load Diffusion Model (quant_preset none) -> Ferry Offload Model -> KSampler``

(disk tier, block level) are ``torch.equal``; the log shows Ferry laid each model out, and
that its loader kept the weights in the file (it did not fall back to loading them whole).

The models are tiny random ones built by core's own model configs (make_arch_models.py, run
with the core's python: ``ARCHS`` has each one's sizes and conditioning), kept only where core's
detection rebuilds the same network from the file, so this sweeps what core detects and
constructs, not a copy of it. Run it on one core (2-3 minutes on 2 CPU cores):

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_arch_sweep.py \
        -p no:cacheprovider

``FERRY_ARCHS=a,b`` picks architectures by name; ``FERRY_ARCHS=all`` adds the big ones (Qwen-Image,
Lumina 2, SDXL: core's smallest build of each is 0.5-1.2 GB). An architecture a core does not
have, or cannot build small, is skipped saying why (Flux before v0.33: its detection fixes the
width at 3072).

Not built (make_arch_models.SKIP has each model config with its reason; the last test checks
that every config of the core under test is built or listed there): models whose every size
core's detection fixes (Mochi, HiDream, Omnigen2, ACE-Step, Stable Cascade, SeedVR2, Z-Image,
Chroma's approximator, AuraFlow's width, Kandinsky 5 Image) or builds at class defaults (PixelDiT,
PiD, HiDream-O1, Ernie-Image, TripoSplat); UNet, Wan, CogVideoX, PixArt and HunyuanDiT variants
whose conditioning needs inputs the test node does not make; audio, audio-video and 3D-shape
models; 2026 architectures not attempted; and detection, segmentation and depth models (no
KSampler).

Before the fix in offload_core/model/meta_build.py, Ferry's loader failed on seven of them:
HunyuanVideo 1.5 (and its SR) and PixArt Sigma sampled differently (a layer built without the
device argument kept its random initialisation), Cosmos 1, Cosmos Predict2 (T2V, I2V) and Anima
failed in KSampler (``AssertionError: pos_embedder.dim_spatial_range``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import COMFY, Server, comfy_checkout, make_base, start_server, stop_server
from ferry_workflows import Client, error_message, ferry, saved_latent_name
from make_arch_models import ARCHS, SKIP
from safetensors.torch import load_file

#: FERRY_ARCHS=a,b picks architectures by name, "all" takes the big ones too (make_arch_models.py
#: marks those whose smallest network core builds is hundreds of MB); default: the small ones.
_ASKED = [n for n in os.environ.get("FERRY_ARCHS", "").split(",") if n]
CHOSEN = (
    list(ARCHS)
    if _ASKED == ["all"]
    else _ASKED or [n for n, spec in ARCHS.items() if not spec.get("big")]
)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, Any]]]:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("arch-sweep")
    make_base(base, py, comfy, "make_arch_models.py", *CHOSEN, timeout=1800)
    built = json.loads((base / "models" / "arch-sweep.json").read_text())
    srv = start_server(comfy, py, base)
    try:
        yield srv, built
    finally:
        stop_server(srv)
        shutil.rmtree(base / "models", ignore_errors=True)  # the biggest are hundreds of MB


def sweep_graph(
    name: str, spec: dict[str, Any], prefix: str, *, ferry_loader: bool, offload: bool
) -> dict[str, Any]:
    file = spec["file"]
    if ferry_loader:
        loader = {
            "class_type": "FerryLoadDiffusionModelQuantized",
            "inputs": {"unet_name": file, "quant_preset": "none", "cache": False},
        }
    else:
        loader = {
            "class_type": "UNETLoader",
            "inputs": {"unet_name": file, "weight_dtype": "default"},
        }
    g: dict[str, Any] = {"1": loader}
    model = ["1", 0]
    if offload:
        cls, inputs = ferry(tier="disk", level="block")
        g["10"] = {"class_type": cls, "inputs": {"model": model, **inputs}}
        model = ["10", 0]
    cond = spec["cond"]
    for nid, seed in (("2", 1), ("3", 2)):
        inputs = {"seed": seed, **cond, "extra": json.dumps(cond.get("extra", {}))}
        g[nid] = {"class_type": "FerryTestConditioning", "inputs": inputs}
    shape = ",".join(str(n) for n in spec["latent"])
    g["4"] = {"class_type": "FerryTestLatent", "inputs": {"shape": shape}}
    g["5"] = {
        "class_type": "KSampler",
        "inputs": {
            "model": model, "positive": ["2", 0], "negative": ["3", 0], "latent_image": ["4", 0],
            "seed": 7, "steps": 2, "cfg": 2.0, "sampler_name": "euler", "scheduler": "simple",
            "denoise": 1.0,
        },
    }  # fmt: skip
    g["6"] = {
        "class_type": "SaveLatent",
        "inputs": {"samples": ["5", 0], "filename_prefix": prefix},
    }
    return g


def run(srv: Server, g: dict[str, Any]) -> torch.Tensor:
    entry = Client(srv.url).run(g, timeout=600)
    assert entry["status"]["status_str"] == "success", f"{error_message(entry)}\n{srv.log_tail()}"
    return load_file(str(srv.base / "output" / saved_latent_name(entry)))["latent_tensor"]


def said(srv: Server, text: str) -> int:
    return srv.log.read_text(errors="replace").count(text)


@pytest.mark.parametrize("name", CHOSEN)
def test_plain_and_ferry_equal(sweep: tuple[Server, dict[str, Any]], name: str) -> None:
    srv, built = sweep
    spec = built.get(name, {"skip": "not built"})
    if "skip" in spec:
        pytest.skip(f"{name}: {spec['skip']}")
    plain = run(srv, sweep_graph(name, spec, f"{name}-plain", ferry_loader=False, offload=False))
    assert torch.isfinite(plain).all() and plain.abs().sum() > 0, "the plain run says nothing"

    laid = said(srv, "ferry: laid out")
    offloaded = run(srv, sweep_graph(name, spec, f"{name}-ferry", ferry_loader=False, offload=True))
    assert said(srv, "ferry: laid out") > laid, "Ferry Offload Model did not lay the model out"

    laid = said(srv, "ferry: laid out")
    loaded = run(srv, sweep_graph(name, spec, f"{name}-loader", ferry_loader=True, offload=True))
    assert said(srv, "ferry: laid out") > laid, "Ferry's loader's model was not laid out"
    whole = [
        line
        for line in srv.log.read_text(errors="replace").splitlines()
        if spec["file"] in line and ("cannot stay in its file" in line or "loaded whole" in line)
    ]
    assert not whole, f"Ferry's loader loaded the model whole: {whole}"

    assert torch.equal(offloaded, plain), f"Ferry Offload Model: {diff(offloaded, plain)}"
    assert torch.equal(loaded, plain), f"Ferry's loader: {diff(loaded, plain)}"


def diff(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape:
        return f"shapes {list(a.shape)} != {list(b.shape)}"
    return f"max abs diff {(a.float() - b.float()).abs().max().item():.3g}"


def test_every_model_config_of_the_core_is_swept_or_says_why() -> None:
    """Each model config in this core's ``comfy.supported_models.models`` is built by the sweep
    or named in make_arch_models.SKIP with the reason."""
    text = (Path(str(COMFY)) / "comfy" / "supported_models.py").read_text()
    lists = re.findall(r"^models\s*\+?=\s*\[(.*?)\]", text, flags=re.S | re.M)
    names = {n for body in lists for n in re.findall(r"\w+", body)}
    assert len(names) > 20, "read no list of model configs"
    swept = {spec["config"] for spec in ARCHS.values()}
    assert sorted(names - swept - set(SKIP)) == []
