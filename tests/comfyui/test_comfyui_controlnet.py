"""ControlNets, model patches and CLIP vision through Ferry (issue 38), in real ComfyUI: each
graph's output is ``torch.equal`` to the same graph without Ferry, every tier and level:

    UNETLoader (tiny Flux) + ControlNetLoader (Flux-shaped) -> Ferry Offload ControlNet
        -> ControlNetApplyAdvanced -> KSampler
    tiny SDXL + ControlNetLoader (SDXL-shaped) -> Ferry Offload ControlNet
        -> ControlNetApplyAdvanced -> KSampler
    tiny Qwen-Image + its block-wise ControlNet -> Ferry Offload Model Patch
        -> QwenImageDiffsynthControlnet -> KSampler
    clip_vision_h-shaped CLIP vision -> Ferry Offload CLIP Vision -> CLIPVisionEncode

The networks are tiny random ones built by core's own classes (make_control_models.py); core's
ControlNetLoader reads both ControlNets. Where core's loader fixes sizes a tiny file cannot
have (SDXL's UNet, Qwen-Image's, the model patch's, clip_vision_h's), a test loader builds the
network with core's classes from the file's config (ferry_tiny_nodes.py); the Qwen patch's
control image is encoded by a VAE stand-in (a fixed function of the image). One core, a few
minutes on 2 CPU cores:

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_controlnet.py
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import HERE, Server, comfy_checkout, make_base, run_maker, start_server, stop_server
from ferry_workflows import AUTO, Client, error_message, saved_latent_name
from ferry_workflows import ferry as ferry_model
from safetensors.torch import load_file

#: case -> the Ferry node, the kind and title its line has in /ferry/stats, the groups it has at
#: block level with blocks_per_group 1, and the core node it runs through (skipped where the
#: core has none).
CASES: dict[str, dict[str, Any]] = {
    "flux-cn": {"node": "FerryOffloadControlNet", "kind": "controlnet",
                "title": "ControlNet: ControlNetFlux", "groups": 2, "core": "ControlNetLoader"},
    "sdxl-cn": {"node": "FerryOffloadControlNet", "kind": "controlnet",
                "title": "ControlNet: ControlNet", "groups": None, "core": "ControlNetLoader"},
    "qwen-patch": {"node": "FerryOffloadModelPatch", "kind": "model_patch",
                   "title": "model patch: QwenImageBlockWiseControlNet", "groups": 2,
                   "core": "QwenImageDiffsynthControlnet"},
    "clip-vision": {"node": "FerryOffloadClipVision", "kind": "clip_vision",
                    "title": "CLIP vision: CLIPVisionModelProjection", "groups": 3,
                    "core": "CLIPVisionEncode"},
}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-control")
    make_base(base, py, comfy, "make_control_models.py")
    run_maker(base, py, comfy, "make_arch_models.py", "flux")  # the Flux the ControlNet steers
    shutil.copy(HERE / "ferry_tiny_nodes.py", base / "custom_nodes" / "ferry_tiny_nodes.py")
    srv = start_server(comfy, py, base)
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def client(server: Server) -> Client:
    return Client(server.url)


@pytest.fixture(scope="module")
def built(server: Server, client: Client) -> dict[str, Any]:
    """What make_control_models.py built in this core (or why not), and the core's nodes."""
    made = json.loads((server.base / "models" / "control-models.json").read_text())
    return {"made": made, "nodes": set(client.get("/object_info"))}


def need(built: dict[str, Any], case: str) -> None:
    key = {"flux-cn": "flux_cn", "sdxl-cn": "sdxl_cn", "qwen-patch": "qwen_patch",
           "clip-vision": "clip_vision"}[case]  # fmt: skip
    why = built["made"][key].get("skip")
    if why:
        pytest.skip(why)
    if CASES[case]["core"] not in built["nodes"]:
        pytest.skip(f"this core has no {CASES[case]['core']}")


def settings(**over: Any) -> dict[str, Any]:
    """A Ferry offload node's widgets: Ferry Offload Model's, the same defaults."""
    return ferry_model(**over)[1]


def _sampled(g: dict[str, Any], model: list[Any], positive: list[Any], negative: list[Any],
             latent: dict[str, Any], prefix: str, seed: int) -> dict[str, Any]:  # fmt: skip
    g["8"] = {"class_type": latent["class_type"], "inputs": latent["inputs"]}
    g["9"] = {
        "class_type": "KSampler",
        "inputs": {
            "model": model, "positive": positive, "negative": negative, "latent_image": ["8", 0],
            "seed": seed, "steps": 2, "cfg": 2.0, "sampler_name": "euler", "scheduler": "simple",
            "denoise": 1.0,
        },
    }  # fmt: skip
    g["99"] = {
        "class_type": "SaveLatent",
        "inputs": {"samples": ["9", 0], "filename_prefix": prefix},
    }
    return g


def _cond(seed: int, dim: int, pooled: int) -> dict[str, Any]:
    return {"class_type": "FerryTestConditioning",
            "inputs": {"seed": seed, "tokens": 8, "dim": dim, "pooled": pooled}}  # fmt: skip


def _ferry(g: dict[str, Any], case: str, name: str, src: list[Any], ferry: dict[str, Any] | None) -> list[Any]:  # fmt: skip
    if ferry is None:
        return src
    g["20"] = {"class_type": CASES[case]["node"], "inputs": {name: src, **ferry}}
    return ["20", 0]


def controlnet_graph(case: str, prefix: str, ferry: dict[str, Any] | None, seed: int = 7) -> dict[str, Any]:  # fmt: skip
    if case == "flux-cn":
        model = {
            "class_type": "UNETLoader",
            "inputs": {"unet_name": "ferry-arch-flux.safetensors", "weight_dtype": "default"},
        }
        cn, pooled, chans = "ferry-tiny-flux-cn.safetensors", 32, 16
    else:
        model = {
            "class_type": "FerryTestTinyModel",
            "inputs": {"unet_name": "ferry-tiny-sdxl.safetensors"},
        }
        cn, pooled, chans = "ferry-tiny-sdxl-cn.safetensors", 1280, 4
    g: dict[str, Any] = {"1": model, "2": _cond(1, 32, pooled), "3": _cond(2, 32, pooled)}
    g["4"] = {"class_type": "ControlNetLoader", "inputs": {"control_net_name": cn}}
    g["5"] = {"class_type": "FerryTestImage", "inputs": {"seed": 3, "width": 128, "height": 128}}
    net = _ferry(g, case, "control_net", ["4", 0], ferry)
    g["6"] = {
        "class_type": "ControlNetApplyAdvanced",
        "inputs": {"positive": ["2", 0], "negative": ["3", 0], "control_net": net,
                   "image": ["5", 0], "strength": 1.0, "start_percent": 0.0, "end_percent": 1.0},
    }  # fmt: skip
    latent = {"class_type": "FerryTestLatent", "inputs": {"shape": f"{chans},16,16"}}
    return _sampled(g, ["1", 0], ["6", 0], ["6", 1], latent, prefix, seed)


def patch_graph(case: str, prefix: str, ferry: dict[str, Any] | None, seed: int = 7) -> dict[str, Any]:  # fmt: skip
    g: dict[str, Any] = {
        "1": {"class_type": "FerryTestTinyModel", "inputs": {"unet_name": "ferry-tiny-qwen-image.safetensors"}},
        "2": _cond(1, 32, 0), "3": _cond(2, 32, 0),
        "4": {"class_type": "FerryTestTinyModelPatch", "inputs": {"name": "ferry-tiny-qwen-patch.safetensors"}},
        "5": {"class_type": "FerryTestImage", "inputs": {"seed": 3, "width": 128, "height": 128}},
        "7": {"class_type": "FerryTestLatentVAE", "inputs": {}},
    }  # fmt: skip
    patch = _ferry(g, case, "model_patch", ["4", 0], ferry)
    g["6"] = {
        "class_type": "QwenImageDiffsynthControlnet",
        "inputs": {"model": ["1", 0], "model_patch": patch, "vae": ["7", 0], "image": ["5", 0],
                   "strength": 1.0},
    }  # fmt: skip
    latent = {"class_type": "FerryTestLatent", "inputs": {"shape": "16,1,16,16"}}
    return _sampled(g, ["6", 0], ["2", 0], ["3", 0], latent, prefix, seed)


def vision_graph(case: str, prefix: str, ferry: dict[str, Any] | None, seed: int = 3) -> dict[str, Any]:  # fmt: skip
    g: dict[str, Any] = {
        "1": {"class_type": "FerryTestTinyClipVision", "inputs": {"clip_name": "ferry-tiny-clip-vision-h.safetensors"}},
        "5": {"class_type": "FerryTestImage", "inputs": {"seed": seed, "width": 64, "height": 48}},
    }  # fmt: skip
    cv = _ferry(g, case, "clip_vision", ["1", 0], ferry)
    g["6"] = {
        "class_type": "CLIPVisionEncode",
        "inputs": {"clip_vision": cv, "image": ["5", 0], "crop": "center"},
    }
    g["99"] = {
        "class_type": "FerryTestSaveClipVisionOutput",
        "inputs": {"clip_vision_output": ["6", 0], "filename_prefix": prefix},
    }
    return g


GRAPHS = {"flux-cn": controlnet_graph, "sdxl-cn": controlnet_graph, "qwen-patch": patch_graph,
          "clip-vision": vision_graph}  # fmt: skip


def run(client: Client, srv: Server, case: str, prefix: str, ferry: dict[str, Any] | None, **kw: Any) -> dict[str, torch.Tensor]:  # fmt: skip
    entry = client.run(GRAPHS[case](case, prefix, ferry, **kw), timeout=600)
    assert entry["status"]["status_str"] == "success", f"{error_message(entry)}\n{srv.log_tail()}"
    if case == "clip-vision":
        return load_file(str(srv.base / "output" / f"{prefix}.safetensors"))
    saved = load_file(str(srv.base / "output" / saved_latent_name(entry)))
    return {"latent_tensor": saved["latent_tensor"]}  # not SaveLatent's empty version marker


def laid_out(srv: Server) -> int:
    return srv.log.read_text(errors="replace").count("ferry: laid out")


def assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want) and want
    for k in want:
        diff = (got[k].float() - want[k].float()).abs().max().item()
        assert torch.equal(got[k], want[k]), f"{k}: max abs diff {diff:.3g}"


@pytest.fixture(scope="module")
def plain(client: Client, server: Server, built: dict[str, Any]) -> dict[str, dict[str, torch.Tensor]]:  # fmt: skip
    out = {}
    for case in CASES:
        try:
            need(built, case)
        except pytest.skip.Exception:
            continue
        out[case] = run(client, server, case, f"{case}-plain", None)
        for k, t in out[case].items():
            assert torch.isfinite(t).all() and t.abs().sum() > 0, (case, k)
    return out


def test_the_nodes_are_listed_with_the_model_nodes_widgets(client: Client) -> None:
    info = client.get("/object_info")
    model = info["FerryOffloadModel"]["input"]
    for node, name, out in (("FerryOffloadControlNet", "control_net", "CONTROL_NET"),
                            ("FerryOffloadModelPatch", "model_patch", "MODEL_PATCH"),
                            ("FerryOffloadClipVision", "clip_vision", "CLIP_VISION")):  # fmt: skip
        got = info[node]["input"]
        assert info[node]["output"] == [out]
        assert list(got["required"]) == [name, *list(model["required"])[1:]]
        # bake_lora is the diffusion model's alone (seam/site.py ``bakes``), and last.
        assert list(got["optional"]) == [k for k in model["optional"] if k != "bake_lora"]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tier", ["pinned", "ram", "disk"])
@pytest.mark.parametrize("level", ["block", "leaf"])
def test_same_output_with_ferry(
    client: Client, server: Server, built: dict[str, Any], plain: dict[str, Any],
    case: str, tier: str, level: str,
) -> None:  # fmt: skip
    need(built, case)
    before = laid_out(server)
    got = run(client, server, case, f"{case}-{tier}-{level}", settings(tier=tier, level=level))
    assert laid_out(server) > before, f"{CASES[case]['node']} did not lay the network out"
    assert_equal(got, plain[case])
    (o,) = [o for o in client.live() if o["kind"] == CASES[case]["kind"]]
    assert o["title"] == CASES[case]["title"], o
    assert (o["tier"], o["level"]) == (tier, level)
    assert o["group_loads"] > 0 and o["bytes_moved"] > 0, o
    if level == "block" and CASES[case]["groups"] is not None:
        assert o["groups"] == CASES[case]["groups"], o


@pytest.mark.parametrize("case", list(CASES))
def test_the_layout_is_kept_across_prompts_and_released_on_unload(
    client: Client, server: Server, built: dict[str, Any], plain: dict[str, Any], case: str
) -> None:
    need(built, case)
    ferry = settings(**AUTO)  # "auto" planned for the network, as Ferry Offload Model's
    # A first prompt takes up a /free a previous test's unload_models may have left pending
    # (ComfyUI's worker reads its flags after the next prompt: ferry_workflows.Client).
    run(client, server, case, f"{case}-auto-0", ferry, seed=5)
    first = run(client, server, case, f"{case}-auto-1", ferry)
    assert_equal(first, plain[case])
    before = laid_out(server)
    again = run(client, server, case, f"{case}-auto-2", ferry, seed=11)  # another input
    assert laid_out(server) == before, "a second prompt laid the network out again"
    assert not torch.equal(next(iter(again.values())), next(iter(first.values())))
    assert [o["kind"] for o in client.live()] == [CASES[case]["kind"]]
    client.unload_models(within_s=60)  # ComfyUI's "Unload models": Ferry lets go


def test_a_t2i_adapter_is_refused_by_name(client: Client, server: Server) -> None:
    """A CONTROL_NET that is no ControlNet with its own patcher (a T2I adapter, a Control-LoRA
    before its first run) is refused naming the input, before anything moves."""
    g = controlnet_graph("sdxl-cn", "refused", settings())
    g["4"] = {"class_type": "FerryTestNoPatcherControlNet", "inputs": {}}
    entry = client.run(g)
    if entry["status"]["status_str"] == "success":
        raise AssertionError("the node took a CONTROL_NET with no patcher")
    assert "control_net: holds no ControlNet Ferry can offload" in error_message(entry)
