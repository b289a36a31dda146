"""Every architecture core runs, through Ferry: the latent of

1. ``UNETLoader -> KSampler`` (plain),
2. ``UNETLoader -> Ferry Offload Model -> KSampler`` and
3. ``Ferry Load Diffusion Model (quant_preset none) -> Ferry Offload Model -> KSampler``

(disk tier, block level) are ``torch.equal``, and the log shows Ferry laid each model out (and
that its loader kept the weights in the file rather than loading the model whole).

The models are tiny random ones built by core's own classes (make_arch_models.py, run with the
core's python; see its ARCHS for each one's sizes), so this sweeps what core's detection and
construction do, not a hand-written copy. Run it on one core (``FERRY_ARCHS=a,b`` picks some):

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_arch_sweep.py \\
        -p no:cacheprovider

An architecture a core does not have is skipped, saying so. Architectures not built small (and
why) are make_arch_models.py's SKIP.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import Server, comfy_checkout, make_base, start_server, stop_server
from ferry_workflows import Client, error_message, ferry, saved_latent_name
from make_arch_models import ARCHS
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
        g[nid] = {"class_type": "FerryTestConditioning", "inputs": {"seed": seed, **cond}}
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
        pytest.skip(spec["skip"])
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
