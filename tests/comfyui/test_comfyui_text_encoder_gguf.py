"""Text encoders through Ferry Offload Text Encoder (issue 29) that other loaders made, in real
ComfyUI, the conditioning compared bit for bit with the same graph without Ferry:

- GGUF text encoders, loaded by ComfyUI-GGUF's CLIPLoaderGGUF (a T5-XXL-shaped encoder in Q8_0,
  in Q4_K/Q5_K + Q8_0, and in F16) and DualCLIPLoaderGGUF (a CLIP-L safetensors file + the Q8_0
  T5, type flux), every tier and both levels. ComfyUI-GGUF's CLIPLoaderGGUF takes only the
  text architectures of its ``TXT_ARCH_LIST`` (t5, t5encoder, llama, qwen2vl, qwen3, qwen3vl):
  not Gemma 2, the LLM of test_comfyui_text_encoder.py (its Llama/Qwen ones need tokenizers
  the checkouts here lack).
- A LoRA (core's LoraLoader, strength_clip 1) on the text encoder: before Ferry Offload Text
  Encoder on a lazy CLIP (Ferry Load Text Encoder(s): weights on meta until the layout) and on
  core's CLIP; after it; and on the GGUF CLIP.

Opt-in: FERRY_COMFYUI (the core); the GGUF tests also FERRY_COMFYUI_GGUF (a ComfyUI-GGUF
checkout, as test_comfyui_gguf.py), e.g.

    FERRY_COMFYUI=/work/comfy/v0.33.0 FERRY_COMFYUI_GGUF=/work/comfy/ComfyUI-GGUF \\
        python -m pytest tests/comfyui/test_comfyui_text_encoder_gguf.py -q
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Server, comfy_checkout, make_base, start_server, stop_server
from ferry_workflows import Client
from test_comfyui_text_encoder import TEXT, assert_equal, encode, ferry_te, laid_out

GGUF_PACK = os.environ.get("FERRY_COMFYUI_GGUF")
needs_gguf = pytest.mark.skipif(
    not GGUF_PACK, reason="set FERRY_COMFYUI_GGUF to a ComfyUI-GGUF checkout to run these"
)

T5 = "ferry-tiny-t5xxl.safetensors"
CLIP_L = "ferry-tiny-clip-l.safetensors"
LORA = "ferry-tiny-te-lora.safetensors"
MODEL = "ferry-tiny-sd3.safetensors"  # LoraLoader's MODEL input: the LoRA has no key for it


def t5_gguf(mix: str) -> str:
    return f"ferry-tiny-t5xxl-{mix}.gguf"


#: case -> (loader node, its inputs, what ComfyUI-GGUF's loader logs for the file's tensors)
GGUF_CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    "t5-q8_0": ("CLIPLoaderGGUF", {"clip_name": t5_gguf("q8_0"), "type": "sd3"}, "Q8_0 ("),
    "t5-k": ("CLIPLoaderGGUF", {"clip_name": t5_gguf("k"), "type": "sd3"}, "Q4_K ("),
    "t5-f16": ("CLIPLoaderGGUF", {"clip_name": t5_gguf("f16"), "type": "sd3"}, "F16 ("),
    "flux-q8_0": (
        "DualCLIPLoaderGGUF",
        {"clip_name1": CLIP_L, "clip_name2": t5_gguf("q8_0"), "type": "flux"},
        "Q8_0 (",
    ),
}
#: The safetensors cases of the LoRA tests: core's loader, and Ferry's in its place.
LORA_CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "t5": ("CLIPLoader", "FerryLoadTextEncoder", {"clip_name": T5, "type": "sd3"}),
    "flux": (
        "DualCLIPLoader",
        "FerryLoadTextEncoderDual",
        {"clip_name1": CLIP_L, "clip_name2": T5, "type": "flux"},
    ),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-te-gguf")
    make_base(base, py, comfy, "make_te_gguf_lora.py")
    if GGUF_PACK:
        pack = Path(GGUF_PACK).resolve()
        (base / "custom_nodes" / "ComfyUI-GGUF").symlink_to(pack, target_is_directory=True)
    srv = start_server(comfy, py, base)
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def client(server: Server) -> Client:
    c = Client(server.url)
    if GGUF_PACK:
        assert "CLIPLoaderGGUF" in c.get("/object_info/CLIPLoaderGGUF"), "ComfyUI-GGUF not loaded"
    return c


def chain_graph(
    loader: str, inputs: dict[str, Any], chain: list[tuple[str, Any]], prefix: str
) -> dict[str, Any]:
    """``loader`` -> each step of ``chain`` in turn (("ferry", its inputs) for Ferry Offload
    Text Encoder, ("lora", strength_clip) for core's LoraLoader) -> CLIPTextEncode -> saved."""
    g: dict[str, Any] = {"1": {"class_type": loader, "inputs": inputs}}
    clip = ["1", 0]
    for i, (step, arg) in enumerate(chain):
        nid = str(10 + i)
        if step == "ferry":
            g[nid] = {"class_type": "FerryOffloadTextEncoder", "inputs": {"clip": clip, **arg}}
        else:
            g.setdefault("20", {"class_type": "UNETLoader", "inputs": {"unet_name": MODEL}})
            g["20"]["inputs"]["weight_dtype"] = "default"
            g[nid] = {
                "class_type": "LoraLoader",
                "inputs": {
                    "model": ["20", 0], "clip": clip, "lora_name": LORA,
                    "strength_model": 1.0, "strength_clip": arg,
                },
            }  # fmt: skip
        clip = [nid, 1 if step == "lora" else 0]
    g["2"] = {"class_type": "CLIPTextEncode", "inputs": {"text": TEXT, "clip": clip}}
    g["3"] = {
        "class_type": "FerryTestSaveConditioning",
        "inputs": {"conditioning": ["2", 0], "filename_prefix": prefix},
    }
    return g


def encode_ferry(
    client: Client, srv: Server, g: dict[str, Any], tier: str, level: str = "block"
) -> dict[str, torch.Tensor]:
    """Encodes ``g`` (Ferry Offload Text Encoder in it) and checks that Ferry laid the encoder
    out for it and streamed it: an equal conditioning from a run without Ferry proves nothing."""
    before = laid_out(srv)
    got = encode(client, srv, g)
    assert laid_out(srv) > before, f"Ferry did not lay the encoder out\n{srv.log_tail()}"
    (o,) = client.live()
    assert o["tier"] == tier and o["level"] == level, o
    assert o["group_loads"] > 0 and o["bytes_moved"] > 0 and o["forwards"] >= 1, o
    assert "WITHOUT Ferry" not in srv.log.read_text(errors="replace"), srv.log_tail()
    return got


@pytest.fixture(scope="module")
def gguf_plain(client: Client, server: Server) -> dict[str, dict[str, torch.Tensor]]:
    out = {}
    for case, (loader, inputs, qtype) in GGUF_CASES.items():
        log_at = len(server.log.read_text(errors="replace"))
        out[case] = encode(client, server, chain_graph(loader, inputs, [], f"{case}-plain"))
        ctx = out[case]["0.context"]
        assert torch.isfinite(ctx).all() and ctx.abs().sum() > 0, f"{case}: plain says nothing"
        # ComfyUI-GGUF loaded the file as GGUF, in the types it was written in.
        log = server.log.read_text(errors="replace")[log_at:]
        assert "gguf qtypes: " in log and qtype in log.split("gguf qtypes: ")[1], log
    return out


@needs_gguf
@pytest.mark.parametrize("case", list(GGUF_CASES))
@pytest.mark.parametrize("tier", ["pinned", "ram", "disk"])
@pytest.mark.parametrize("level", ["block", "leaf"])
def test_gguf_text_encoder_through_ferry(
    client: Client,
    server: Server,
    gguf_plain: dict[str, dict[str, torch.Tensor]],
    case: str,
    tier: str,
    level: str,
) -> None:
    loader, inputs, _ = GGUF_CASES[case]
    g = chain_graph(loader, inputs, [("ferry", ferry_te(tier=tier, level=level))], f"{case}-{tier}")
    assert_equal(encode_ferry(client, server, g, tier, level), gguf_plain[case])


@needs_gguf
def test_gguf_text_encoder_with_a_lora_before_and_after_ferry(
    client: Client, server: Server, gguf_plain: dict[str, dict[str, torch.Tensor]]
) -> None:
    # ComfyUI-GGUF keeps a LoRA on a quantized weight as patches the layer applies per forward
    # (GGUFModelPatcher.patch_weight_to_device); on an F16/F32 one it bakes it in.
    loader, inputs, _ = GGUF_CASES["flux-q8_0"]
    want = encode(client, server, chain_graph(loader, inputs, [("lora", 1.0)], "gguf-lora"))
    assert not torch.equal(want["0.context"], gguf_plain["flux-q8_0"]["0.context"])
    for tier in ("ram", "disk"):
        for order in (
            [("lora", 1.0), ("ferry", ferry_te(tier=tier))],
            [("ferry", ferry_te(tier=tier)), ("lora", 1.0)],
        ):
            name = f"gguf-{order[0][0]}-{tier}"
            got = encode_ferry(client, server, chain_graph(loader, inputs, order, name), tier)
            assert_equal(got, want)


# -- a LoRA on the text encoder ----------------------------------------------------------------


@pytest.fixture(scope="module")
def lora_plain(client: Client, server: Server) -> dict[str, dict[str, torch.Tensor]]:
    """Core's loader -> LoraLoader -> CLIPTextEncode, for each case (and the LoRA matters);
    ``<case>-bare``: core's loader -> CLIPTextEncode."""
    out = {}
    for case, (core, _, inputs) in LORA_CASES.items():
        out[case] = encode(client, server, chain_graph(core, inputs, [("lora", 1.0)], f"{case}-l"))
        out[f"{case}-bare"] = encode(client, server, chain_graph(core, inputs, [], f"{case}-bare"))
        assert not torch.equal(out[case]["0.context"], out[f"{case}-bare"]["0.context"])
    return out


@pytest.mark.parametrize("case", list(LORA_CASES))
@pytest.mark.parametrize("tier", ["pinned", "ram", "disk"])
@pytest.mark.parametrize("ferry_loader", [True, False], ids=["lazy", "core"])
@pytest.mark.parametrize("lora_first", [True, False], ids=["lora-ferry", "ferry-lora"])
def test_lora_on_the_text_encoder(
    client: Client,
    server: Server,
    lora_plain: dict[str, dict[str, torch.Tensor]],
    case: str,
    tier: str,
    ferry_loader: bool,
    lora_first: bool,
) -> None:
    core, ferry_node, inputs = LORA_CASES[case]
    steps: list[tuple[str, Any]] = [("lora", 1.0), ("ferry", ferry_te(tier=tier))]
    if not lora_first:
        steps.reverse()
    loader = ferry_node if ferry_loader else core
    name = f"{case}-{loader}-{steps[0][0]}-{tier}"
    got = encode_ferry(client, server, chain_graph(loader, inputs, steps, name), tier)
    assert_equal(got, lora_plain[case])


@pytest.mark.parametrize("case", list(LORA_CASES))
def test_lora_on_a_lazy_clip_without_ferry_offload(
    client: Client, server: Server, lora_plain: dict[str, dict[str, torch.Tensor]], case: str
) -> None:
    # Ferry's loader, then LoraLoader, then no Ferry node: the files are read whole and core
    # patches them as for CLIPLoader's CLIP.
    _, ferry_node, inputs = LORA_CASES[case]
    got = encode(client, server, chain_graph(ferry_node, inputs, [("lora", 1.0)], f"{case}-lz"))
    assert_equal(got, lora_plain[case])


@pytest.mark.parametrize("ferry_loader", [True, False], ids=["lazy", "core"])
def test_the_lora_goes_when_the_lora_node_goes(
    client: Client,
    server: Server,
    lora_plain: dict[str, dict[str, torch.Tensor]],
    ferry_loader: bool,
) -> None:
    # One loader output (cached by ComfyUI, so one network) encodes with the LoRA and then
    # without it: the LoRA baked into the layout (and into the CLIP-L read whole beside the
    # streamed T5) must not stay in the network.
    core, ferry_node, inputs = LORA_CASES["flux"]
    loader = ferry_node if ferry_loader else core
    for tier in ("ram", "disk"):
        ferry = ("ferry", ferry_te(tier=tier))
        g = chain_graph(loader, inputs, [("lora", 1.0), ferry], f"go-{loader}-{tier}-lora")
        assert_equal(encode_ferry(client, server, g, tier), lora_plain["flux"])
        g = chain_graph(loader, inputs, [ferry], f"go-{loader}-{tier}-bare")
        assert_equal(encode_ferry(client, server, g, tier), lora_plain["flux-bare"])
    g = chain_graph(loader, inputs, [], f"go-{loader}-plain")
    assert_equal(encode(client, server, g), lora_plain["flux-bare"])
