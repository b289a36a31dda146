"""Text encoders through Ferry (issue 29), in real ComfyUI: the conditioning of

    CLIPLoader / DualCLIPLoader -> CLIPTextEncode                              (plain)
    CLIPLoader / DualCLIPLoader -> Ferry Offload Text Encoder -> CLIPTextEncode

is ``torch.equal``, every tier (pinned, ram, disk) and both levels, for a T5-XXL-shaped encoder
(CLIPLoader type sd3), a Gemma-2-shaped LLM encoder (CLIPLoader type lumina2) and Flux's
CLIP-L + T5 pair (DualCLIPLoader type flux): every encoder's repeated layers are groups; the layout is kept while the
prompt changes and released when ComfyUI unloads the models.

The encoders are tiny random ones built by core's own classes and detected by core's loaders
(make_text_encoders.py says how). One core, about 3 minutes on 2 CPU cores:

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_text_encoder.py
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import (
    HAS_AIMDO,
    Server,
    comfy_checkout,
    make_base,
    run_maker,
    start_server,
    stop_server,
)
from ferry_workflows import Client, error_message, graph
from ferry_workflows import ferry as ferry_model
from safetensors.torch import load_file

T5 = "ferry-tiny-t5xxl.safetensors"
CLIP_L = "ferry-tiny-clip-l.safetensors"
GEMMA2 = "ferry-tiny-gemma2.safetensors"
T5_FP8 = "ferry-tiny-t5xxl-fp8.safetensors"  # make_text_encoders.T5XXL_FP8_FILE

#: case -> (loader node, its inputs, the groups every encoder brings at block level: list name
#: -> its layer count, as core's classes build them with make_text_encoders.py's sizes)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, int]]] = {
    "t5": (
        "CLIPLoader",
        {"clip_name": T5, "type": "sd3"},
        {"t5xxl.transformer.encoder.block": 24},
    ),
    "t5-fp8": (
        "CLIPLoader",
        {"clip_name": T5_FP8, "type": "sd3"},
        {"t5xxl.transformer.encoder.block": 24},
    ),
    "flux": (
        "DualCLIPLoader",
        {"clip_name1": CLIP_L, "clip_name2": T5, "type": "flux"},
        {"clip_l.transformer.text_model.encoder.layers": 4, "t5xxl.transformer.encoder.block": 24},
    ),
    "lumina2": (
        "CLIPLoader",
        {"clip_name": GEMMA2, "type": "lumina2"},
        {"gemma2_2b.transformer.model.layers": 4},
    ),
}
TEXT = "a ferry crossing a wide river at dawn, oil painting"
#: case -> the name on its line in /ferry/stats: the encoders the CLIP holds, by core's names.
NAMES = {"t5": "t5xxl", "t5-fp8": "t5xxl", "flux": "clip_l + t5xxl", "lumina2": "gemma2_2b"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-te")
    make_base(base, py, comfy, "make_text_encoders.py")
    # The tiny SD3 too, for the graph that offloads a diffusion model beside its text encoder.
    run_maker(base, py, comfy, "make_tiny_models.py")
    srv = start_server(comfy, py, base)
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def client(server: Server) -> Client:
    return Client(server.url)


def ferry_te(**over: Any) -> dict[str, Any]:
    """Ferry Offload Text Encoder's widgets: Ferry Offload Model's, the same defaults."""
    return ferry_model(**over)[1]


#: Ferry's loader in place of core's: the same inputs.
FERRY_LOADERS = {"CLIPLoader": "FerryLoadTextEncoder", "DualCLIPLoader": "FerryLoadTextEncoderDual"}


def te_graph(
    case: str,
    prefix: str,
    ferry: dict[str, Any] | None = None,
    text: str = TEXT,
    ferry_loader: bool = False,
    **loader_inputs: Any,
) -> dict[str, Any]:
    loader, inputs, _ = CASES[case]
    if ferry_loader:
        loader = FERRY_LOADERS[loader]
    return clip_graph(loader, {**inputs, **loader_inputs}, prefix, ferry, text)


def clip_graph(
    loader: str,
    inputs: dict[str, Any],
    prefix: str,
    ferry: dict[str, Any] | None = None,
    text: str = TEXT,
) -> dict[str, Any]:
    """``loader`` (its ``inputs``), then Ferry Offload Text Encoder with ``ferry`` (None: no
    Ferry node), then CLIPTextEncode of ``text``, the conditioning saved under ``prefix``."""
    g: dict[str, Any] = {"1": {"class_type": loader, "inputs": inputs}}
    clip = ["1", 0]
    if ferry is not None:
        g["10"] = {"class_type": "FerryOffloadTextEncoder", "inputs": {"clip": clip, **ferry}}
        clip = ["10", 0]
    g["2"] = {"class_type": "CLIPTextEncode", "inputs": {"text": text, "clip": clip}}
    g["3"] = {
        "class_type": "FerryTestSaveConditioning",
        "inputs": {"conditioning": ["2", 0], "filename_prefix": prefix},
    }
    return g


def encode(client: Client, srv: Server, g: dict[str, Any]) -> dict[str, torch.Tensor]:
    entry = client.run(g, timeout=600)
    assert entry["status"]["status_str"] == "success", f"{error_message(entry)}\n{srv.log_tail()}"
    prefix = g["3"]["inputs"]["filename_prefix"]
    return load_file(str(srv.base / "output" / f"{prefix}.safetensors"))


def laid_out(srv: Server) -> int:
    return srv.log.read_text(errors="replace").count("ferry: laid out")


def assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].shape == want[k].shape, k
        diff = (got[k].float() - want[k].float()).abs().max().item()
        assert torch.equal(got[k], want[k]), f"{k}: max abs diff {diff:.3g}"


@pytest.fixture(scope="module")
def plain(client: Client, server: Server) -> dict[str, dict[str, torch.Tensor]]:
    out = {case: encode(client, server, te_graph(case, f"{case}-plain")) for case in CASES}
    for case, cond in out.items():
        ctx = cond["0.context"]
        assert torch.isfinite(ctx).all() and ctx.abs().sum() > 0, f"{case}: plain says nothing"
    return out


def test_the_node_is_listed_with_the_model_nodes_widgets(client: Client) -> None:
    info = client.get("/object_info")
    te, model = info["FerryOffloadTextEncoder"]["input"], info["FerryOffloadModel"]["input"]
    assert info["FerryOffloadTextEncoder"]["output"] == ["CLIP"]
    assert list(te["required"]) == ["clip", *list(model["required"])[1:]]
    # bake_lora is the diffusion model's alone (seam/site.py ``bakes``), and last.
    assert list(te["optional"]) == [k for k in model["optional"] if k != "bake_lora"]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tier", ["pinned", "ram", "disk"])
@pytest.mark.parametrize("level", ["block", "leaf"])
def test_same_conditioning_with_ferry(
    client: Client,
    server: Server,
    plain: dict[str, dict[str, torch.Tensor]],
    case: str,
    tier: str,
    level: str,
) -> None:
    before = laid_out(server)
    got = encode(
        client, server, te_graph(case, f"{case}-{tier}-{level}", ferry_te(tier=tier, level=level))
    )
    assert laid_out(server) > before, "Ferry Offload Text Encoder did not lay the encoder out"
    assert_equal(got, plain[case])
    (o,) = client.live()  # the encoder stays loaded, offloaded, after the prompt
    assert o["kind"] == "text_encoder" and o["title"] == f"text encoder: {NAMES[case]}", o
    assert o["tier"] == tier and o["level"] == level
    assert o["group_loads"] > 0 and o["bytes_moved"] > 0, o
    if level == "block":
        # every encoder of the CLIP is laid out, one group per repeated layer of each, and
        # each group was brought in for the encode (at leaf level some layers never run:
        # Flux's CLIP-L projection). Core calls each encoder's forward, never the CLIP's own;
        # the patcher marks each encode_token_weights call as one pass ([Note: a pass the
        # host marks]), so the encode counts (it counted 0 before the mark).
        assert o["groups"] == sum(CASES[case][2].values()), o
        assert o["group_loads"] >= o["groups"], o
    assert o["forwards"] >= 1, o


def test_layout_kept_across_prompts_that_change_the_text(
    client: Client, server: Server, plain: dict[str, dict[str, torch.Tensor]]
) -> None:
    ferry = ferry_te(tier="disk", blocks_per_group=2, prefetch_depth=2)
    encode(client, server, te_graph("flux", "kept-1", ferry))
    laid = laid_out(server)
    other = "a lighthouse in fog"
    got = encode(client, server, te_graph("flux", "kept-2", ferry, text=other))
    assert laid_out(server) == laid, "a new prompt laid the encoder out again"
    want = encode(client, server, te_graph("flux", "kept-plain", text=other))
    assert not torch.equal(want["0.context"], plain["flux"]["0.context"])  # the text mattered
    assert_equal(got, want)
    assert client.live() == []  # the plain CLIP loading released Ferry's layout


def test_unloading_models_releases_the_text_encoder(client: Client, server: Server) -> None:
    encode(client, server, te_graph("lumina2", "to-free", ferry_te(tier="pinned")))
    assert len(client.live()) == 1
    client.unload_models(within_s=5)


def with_ids_prefixed(g: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``g`` with every node id (and every link to one) prefixed, to sit beside another graph."""
    out = {}
    for nid, node in g.items():
        inputs = {
            k: [prefix + v[0], v[1]] if isinstance(v, list) and v and v[0] in g else v
            for k, v in node["inputs"].items()
        }
        out[prefix + nid] = {**node, "inputs": inputs}
    return out


def model_and_text_encoder(prefix: str, seed: int, text: str = TEXT) -> dict[str, Any]:
    """One prompt, two Ferry offloads: the tiny SD3 through Ferry Offload Model (ram) sampled,
    and Flux's CLIP-L + T5 through Ferry Offload Text Encoder (disk) encoding."""
    g = graph([ferry_model(tier="ram")], f"{prefix}-latent", seed=seed)
    te = te_graph("flux", f"{prefix}-cond", ferry_te(tier="disk"), text=text)
    return {**g, **with_ids_prefixed(te, "te")}


def test_the_model_and_the_text_encoder_have_a_line_each(client: Client, server: Server) -> None:
    # Issue 29: /ferry/stats (what the sidebar and the panel read) lists both offloads, the
    # model first, each saying what it is and where its weights are, with its rates and stall.
    entry = client.run(model_and_text_encoder("two-lines", seed=5), timeout=600)
    assert entry["status"]["status_str"] == "success", (
        f"{error_message(entry)}\n{server.log_tail()}"
    )
    model, te = client.live()
    assert model["kind"] == "model" and model["title"] == f"model: {model['name']}", model
    assert te["kind"] == "text_encoder" and te["title"] == "text encoder: clip_l + t5xxl", te
    assert model["tier"] == "ram" and model["tiers"].get("ram", 0) > 0, model
    assert te["tier"] == "disk" and te["tiers"].get("disk", 0) > 0, te
    # Both ran through Ferry: their groups came in, from disk at a measured rate for the encoder.
    assert model["group_loads"] > 0 and te["group_loads"] >= te["groups"] == 28, (model, te)
    assert te["disk_gbps"] > 0 and te["stall_s"] >= 0 and model["stall_s"] >= 0, te


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A second server with ferry_standin_nodes.py's CPU stand-in for dynamic VRAM (v0.15+):
    core then makes every CLIP's patcher a dynamic one."""
    if not HAS_AIMDO:
        pytest.skip("this core has no dynamic VRAM (v0.15+)")
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-te-standin")
    make_base(base, py, comfy, "make_text_encoders.py")
    srv = start_server(comfy, py, base, standin="aimdo")
    try:
        yield srv
    finally:
        stop_server(srv)


def test_under_dynamic_vram_the_delegate_encodes_through_ferry(
    standin: Server, plain: dict[str, dict[str, torch.Tensor]]
) -> None:
    # Ferry drives the dynamic CLIP's non-dynamic delegate (nodes/patcher/dynamic.py), and the CLIP it
    # hands on encodes with the delegate's encoder: laid out, streamed, the same conditioning
    # as the plain server's.
    c = Client(standin.url)
    want = encode(c, standin, te_graph("flux", "dyn-plain"))
    assert_equal(want, plain["flux"])  # the stand-in's plain path is core's plain path
    got = encode(c, standin, te_graph("flux", "dyn-ferry", ferry_te(tier="disk")))
    assert laid_out(standin) == 1
    assert_equal(got, plain["flux"])
    (o,) = c.live()
    assert o["group_loads"] >= o["groups"] == 28 and o["bytes_moved"] > 0, o


# -- Ferry Load Text Encoder(s): the weights stay in the file until the layout ----------------


def test_the_loaders_offer_core_loaders_inputs(client: Client) -> None:
    info = client.get("/object_info")
    for core, ferry in FERRY_LOADERS.items():
        want, got = info[core]["input"], info[ferry]["input"]
        assert list(got["required"]) == list(want["required"]), ferry
        assert options(got["required"]["type"]) == options(want["required"]["type"]), ferry
        assert list(got.get("optional", {})) == list(want.get("optional", {})), ferry
        assert info[ferry]["output"] == ["CLIP"]


def options(spec: list[Any]) -> list[str]:
    """A combo's choices in /object_info: V1 nodes list them, V3 nodes say COMBO."""
    return spec[0] if isinstance(spec[0], list) else spec[1]["options"]  # type: ignore[no-any-return]


def files_of(case: str) -> list[str]:
    return [v for k, v in CASES[case][1].items() if k.startswith("clip_name")]


@pytest.mark.parametrize("case", list(CASES))
def test_ferry_loader_then_a_plain_node_reads_the_files_whole(
    client: Client, server: Server, plain: dict[str, dict[str, torch.Tensor]], case: str
) -> None:
    log_at = len(server.log.read_text(errors="replace"))
    got = encode(client, server, te_graph(case, f"{case}-fl-plain", ferry_loader=True))
    assert_equal(got, plain[case])
    log = server.log.read_text(errors="replace")[log_at:]
    assert "cannot stay in its file" not in log, log
    assert "reading " in log and "whole (no Ferry offload node" in log, log
    assert client.live() == []


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tier", ["pinned", "ram", "disk"])
@pytest.mark.parametrize("level", ["block", "leaf"])
def test_ferry_loader_streams_the_file_into_the_layout(
    client: Client,
    server: Server,
    plain: dict[str, dict[str, torch.Tensor]],
    case: str,
    tier: str,
    level: str,
) -> None:
    log_at = len(server.log.read_text(errors="replace"))
    ferry = ferry_te(tier=tier, level=level)
    got = encode(
        client, server, te_graph(case, f"{case}-fl-{tier}-{level}", ferry, ferry_loader=True)
    )
    assert_equal(got, plain[case])
    log = server.log.read_text(errors="replace")[log_at:]
    assert "ferry: laid out" in log, log
    assert "cannot stay in its file" not in log and "no Ferry offload node" not in log, log
    # Every file is the layout's source for its own encoder (issue 40): none is read whole.
    for name in files_of(case):
        assert f"{name} whole" not in log, log
    (o,) = client.live()
    assert o["tier"] == tier and o["group_loads"] > 0, o


def test_unloading_models_releases_the_shared_lazy_text_encoder(
    client: Client, server: Server
) -> None:
    # The Ferry loader's Flux CLIP with the default device, the loader output the loader tests
    # above used: ComfyUI's "Unload models" releases its layout (nothing of it listed or held
    # after). An earlier session saw a layout outlive /free here on v0.33 and v0.8: ComfyUI had
    # not run the unload yet (its flag still pending 12 s later; Client.unload_models says why).
    encode(
        client, server, te_graph("flux", "fl-shared-free", ferry_te(tier="disk"), ferry_loader=True)
    )
    (o,) = client.live()
    assert o["title"] == "text encoder: clip_l + t5xxl", o
    client.unload_models(within_s=10)


def test_ferry_loader_unloads_and_encodes_again(client: Client, server: Server) -> None:
    # Unloading moves the CLIP to its offload device while its weights are back in their files
    # (meta): only what is real moves (a plain .to() would raise and stop ComfyUI's worker).
    # device "cpu" (CLIPLoader's own widget; the CPU is the device here anyway): a loader
    # output of its own, not the cached CLIP every earlier prompt shared.
    ferry = ferry_te(tier="disk")
    g = te_graph("flux", "fl-unload-1", ferry, ferry_loader=True, device="cpu")
    encode(client, server, g)
    client.unload_models(within_s=10)
    laid = laid_out(server)
    other = "a lighthouse in fog, long exposure"
    g = te_graph("flux", "fl-unload-2", ferry, other, ferry_loader=True, device="cpu")
    got = encode(client, server, g)
    assert laid_out(server) == laid + 1
    assert_equal(got, encode(client, server, te_graph("flux", "fl-unload-plain", text=other)))


def test_under_dynamic_vram_the_ferry_loader_streams_and_reads_whole(
    standin: Server, plain: dict[str, dict[str, torch.Tensor]]
) -> None:
    # Core's Linears are built without weights under dynamic VRAM (the stand-in turns it on):
    # the trace still sees which file tensor each one was given.
    c = Client(standin.url)
    ferry = ferry_te(tier="disk")
    assert_equal(
        encode(c, standin, te_graph("flux", "dyn-fl", ferry, ferry_loader=True)), plain["flux"]
    )
    assert_equal(encode(c, standin, te_graph("t5", "dyn-fl-plain", ferry_loader=True)), plain["t5"])
    assert "cannot stay in its file" not in standin.log.read_text(errors="replace")
