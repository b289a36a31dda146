"""ComfyUI's own quantized formats streamed by Ferry (issue 40), in real ComfyUI: a Wan-shaped
``fp8_scaled`` diffusion model, a ``comfy_quant`` mixed fp8/bf16 one and (v0.33: core's MXFP8
layout runs on the CPU) an MXFP8 one, and an ``fp8_scaled`` T5, all built with core's classes
(make_quant_models.py). Every latent and conditioning is ``torch.equal`` to core's loaders
without Ferry:

    Ferry Load Diffusion Model -> Ferry Offload Model (every tier, block and leaf) -> KSampler
    UNETLoader                 -> Ferry Offload Model                              -> KSampler
    Ferry Load Text Encoder    -> Ferry Offload Text Encoder                       -> CLIPTextEncode

and Ferry's loader must say it kept the file ("stays in its file"), not "loading it whole".

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_core_quant.py
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import (
    Server,
    comfy_checkout,
    core_has,
    make_base,
    run_maker,
    start_server,
    stop_server,
)
from ferry_workflows import Client, error_message, ferry, graph
from test_comfyui_real import run_ok
from test_comfyui_text_encoder import assert_equal, clip_graph, encode

HAS_COMFY_QUANT = core_has("comfy/utils.py", "def convert_old_quants")
HAS_MXFP8 = core_has("comfy/quant_ops.py", "TensorCoreMXFP8Layout")
COND = {"dim": 4096}  # Wan reads 4096-wide text
LATENT = ("EmptyHunyuanLatentVideo", {"width": 32, "height": 32, "length": 1, "batch_size": 1})
MODELS = ["ferry-q-wan-fp8scaled.safetensors"]
if HAS_COMFY_QUANT:  # v0.3.64 has no comfy_quant: it reads the configs as unexpected keys
    MODELS.append("ferry-q-wan-mixed.safetensors")
if HAS_MXFP8:
    MODELS.append("ferry-q-wan-mxfp8.safetensors")
T5 = "ferry-q-t5-fp8scaled.safetensors"
TIERS = [("pinned", "block"), ("ram", "block"), ("disk", "block"), ("ram", "leaf"),
         ("disk", "leaf")]  # fmt: skip
_seeds = itertools.count(500)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-quant")
    make_base(base, py, comfy, "make_text_encoders.py")
    run_maker(base, py, comfy, "make_quant_models.py")
    srv = start_server(comfy, py, base)
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def client(server: Server) -> Client:
    return Client(server.url)


def said(srv: Server, text: str, within_s: float = 0) -> int:
    """How often the server's log says ``text`` (waiting up to ``within_s`` for a first one:
    v0.3.64 writes its log through a buffer)."""
    end = time.monotonic() + within_s
    while True:
        n = srv.log.read_text(errors="replace").count(text)
        if n or time.monotonic() >= end:
            return n
        time.sleep(0.5)


def unet(name: str) -> tuple[str, dict[str, Any]]:
    return ("UNETLoader", {"unet_name": name, "weight_dtype": "default"})


def ferry_loader(name: str) -> tuple[str, dict[str, Any]]:
    inputs = {"unet_name": name, "quant_preset": "none", "cache": False, "weight_dtype": "default"}
    return ("FerryLoadDiffusionModelQuantized", inputs)


def run(c: Client, srv: Server, chain: list[Any], prefix: str, loader: Any) -> torch.Tensor:
    g = graph(chain, prefix, loader=loader, latent=LATENT, cond=COND, steps=2, seed=next(_seeds))
    return run_ok(c, srv, g)


@pytest.mark.parametrize("name", MODELS)
def test_quantized_diffusion_model_streams_bit_equal(
    client: Client, server: Server, name: str
) -> None:
    seed = next(_seeds)

    def at(chain: list[Any], prefix: str, loader: Any) -> torch.Tensor:
        g = graph(chain, prefix, loader=loader, latent=LATENT, cond=COND, steps=2, seed=seed)
        return run_ok(client, server, g)

    want = at([], f"{name}-plain", unet(name))
    assert torch.isfinite(want).all()
    whole = said(server, "loading it whole")
    for tier, level in TIERS:
        got = at([ferry(tier=tier, level=level)], f"{name}-f-{tier}-{level}", ferry_loader(name))
        assert torch.equal(got, want), (name, tier, level, (got - want).abs().max())
        got = at([ferry(tier=tier, level=level)], f"{name}-u-{tier}-{level}", unet(name))
        assert torch.equal(got, want), ("UNETLoader", name, tier, level)
    # Ferry's loader kept the file: it said so, and never fell back to a whole load.
    assert said(server, f"{name} (ComfyUI's", within_s=30) >= 1, server.log_tail()
    assert said(server, "loading it whole") == whole, server.log_tail()


def lora() -> tuple[str, dict[str, Any]]:
    return ("LoraLoaderModelOnly", {"lora_name": "ferry-q-wan-lora.safetensors",
                                    "strength_model": 1.0})  # fmt: skip


@pytest.mark.parametrize("name", MODELS[:2])
def test_lora_on_a_quantized_model_before_and_after_ferry_equals_cores(
    client: Client, server: Server, name: str
) -> None:
    seed = next(_seeds)

    def at(chain: list[Any], prefix: str, loader: Any) -> torch.Tensor:
        g = graph(chain, prefix, loader=loader, latent=LATENT, cond=COND, steps=2, seed=seed)
        return run_ok(client, server, g)

    want = at([lora()], f"{name}-lora-plain", unet(name))
    assert not torch.equal(want, at([], f"{name}-nolora", unet(name)))  # the LoRA does something
    whole = said(server, "whole (no Ferry offload node")
    for tier in ("ram", "disk"):
        f = ferry(tier=tier)
        for order, chain in (("before", [lora(), f]), ("after", [f, lora()])):
            for which, loader in (("ferry", ferry_loader(name)), ("unet", unet(name))):
                got = at(chain, f"{name}-lora-{order}-{which}-{tier}", loader)
                assert torch.equal(got, want), (name, tier, order, which)
    # Ferry's loader streamed the patched layers (core's patch per tensor as it is read): the
    # model was never read whole for the LoRA. v0.3.64's scaled-fp8 layers keep their scale in
    # a tensor of their own, which core's patch reads: the model is read whole there.
    if HAS_COMFY_QUANT:
        assert said(server, "whole (no Ferry offload node") == whole, server.log_tail()
    else:
        assert said(server, "whole (no Ferry offload node", within_s=30) > whole


def test_quantized_model_read_whole_without_ferry_offload(client: Client, server: Server) -> None:
    name = MODELS[0]
    seed = next(_seeds)
    want = run_ok(client, server, graph([], "w-plain", loader=unet(name), latent=LATENT,
                                        cond=COND, steps=2, seed=seed))  # fmt: skip
    got = run_ok(client, server, graph([], "w-ferry", loader=ferry_loader(name), latent=LATENT,
                                       cond=COND, steps=2, seed=seed))  # fmt: skip
    assert torch.equal(got, want)


@pytest.mark.parametrize("tier,level", TIERS)
def test_fp8_scaled_t5_streams_bit_equal(
    client: Client, server: Server, tier: str, level: str
) -> None:
    inputs = {"clip_name": T5, "type": "sd3"}  # core ships no UMT5 tokenizer here
    want = encode(client, server, clip_graph("CLIPLoader", inputs, f"t5-plain-{tier}-{level}"))
    f = ferry(tier=tier, level=level)[1]
    whole = said(server, "loading it whole")
    got = encode(
        client, server, clip_graph("FerryLoadTextEncoder", inputs, f"t5-{tier}-{level}", f)
    )
    assert_equal(got, want)
    got = encode(client, server, clip_graph("CLIPLoader", inputs, f"t5-u-{tier}-{level}", f))
    assert_equal(got, want)
    assert said(server, "loading it whole") == whole, server.log_tail()


def test_a_truncated_quantized_file_is_named_before_work(client: Client, server: Server) -> None:
    folder = server.base / "models" / "diffusion_models"
    data = (folder / MODELS[0]).read_bytes()
    (folder / "ferry-q-truncated.safetensors").write_bytes(data[: len(data) - 4096])
    g = graph([ferry()], "bad", loader=ferry_loader("ferry-q-truncated.safetensors"),
              latent=LATENT, cond=COND, steps=2)  # fmt: skip
    entry = client.run(g)
    assert entry["status"]["status_str"] == "error"
    msg = error_message(entry)
    assert msg.startswith("unet_name: ") or "unet_name: " in msg, msg
    assert "ferry-q-truncated.safetensors" in msg, msg
