"""The whole graph of issue 29, as a user builds it: a text encoder bigger than the diffusion
model, the diffusion model, a VAE, and the image out (make_text_encoders.py --big and
make_whole_graph.py write the files). Shared by test_comfyui_whole_graph_cgroup.py and
bench_whole_graph.py.

    text encoder loader [-> Ferry Offload Text Encoder] -> CLIPTextEncode -+-> KSampler -> SaveLatent
                                                      ConditioningZeroOut -+      |
    diffusion model loader [-> Ferry Offload Model] ----------------------------'
    VAELoader -> VAEDecode (of the latent) -> the image saved as its exact tensor

Which nodes are Ferry's is a ``Variant``: nothing (core's loaders), the text encoder only, the
diffusion model only, or both (Ferry's loaders, each followed by its offload node).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from conftest import comfy_checkout, make_base, run_maker
from ferry_workflows import AUTO, Client, error_message, ferry
from make_text_encoders import BIG_T5XXL_FILE
from make_whole_graph import MODEL_FILE, VAE_FILE

TEXT = "a ferry crossing a wide river at dawn, oil painting"
DEPTH = 10  # the MMDiT: 0.6 GB of float32
T5_LAYERS = 36  # the T5: 2.3-2.5 GB of float16 (its width is the core's detection's)


@dataclass(frozen=True)
class Variant:
    """Which halves of the graph go through Ferry, and the offload nodes' tier ("auto": every
    setting the planner chooses is on auto)."""

    name: str
    text_encoder: bool
    model: bool
    tier: str = "disk"


PLAIN = Variant("plain", text_encoder=False, model=False)
FERRY_BOTH = Variant("ferry-both", text_encoder=True, model=True)
FERRY_AUTO = Variant("ferry-auto", text_encoder=True, model=True, tier="auto")
VARIANTS = (
    PLAIN,
    Variant("ferry-text-encoder", text_encoder=True, model=False),
    Variant("ferry-model", text_encoder=False, model=True),
    FERRY_BOTH,
)


def make_graph_base(base: Path, depth: int = DEPTH) -> None:
    """A ComfyUI base directory (conftest.make_base) with the whole graph's files, written by
    the core's Python with the core's classes (a few minutes); ``depth``: the MMDiT's."""
    comfy, py = comfy_checkout()
    make_base(
        base, py, comfy, "make_text_encoders.py", "--big", f"--big-layers={T5_LAYERS}", timeout=1800
    )
    run_maker(base, py, comfy, "make_whole_graph.py", str(depth), timeout=1800)


def run_graph(srv: Any, g: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Runs a ``whole_graph`` prompt to success and reads what it saved (``outputs``); a
    server the kernel killed (a memory limit) fails the test with its log's tail."""
    try:
        entry = Client(srv.url).run(g, timeout=1800)
    except OSError as e:  # the server is gone
        srv.proc.wait(timeout=60)
        raise AssertionError(
            f"ComfyUI died ({e}; exit {srv.proc.returncode}):\n{srv.log_tail()}"
        ) from e
    assert entry["status"]["status_str"] == "success", f"{error_message(entry)}\n{srv.log_tail()}"
    return outputs(srv.base, entry, g["7"]["inputs"]["filename_prefix"])


def _widgets(v: Variant) -> dict[str, Any]:
    return ferry(**AUTO)[1] if v.tier == "auto" else ferry(tier=v.tier)[1]


def whole_graph(v: Variant, prefix: str, steps: int = 2, size: int = 64) -> dict[str, Any]:
    """The API-format workflow; the latent is saved as ``<prefix>`` (SaveLatent) and the image
    as output/<prefix>-image.safetensors (``outputs`` reads both)."""
    te_inputs = {"clip_name": BIG_T5XXL_FILE, "type": "sd3"}
    g: dict[str, Any] = {
        "1": {"class_type": "FerryLoadTextEncoder" if v.text_encoder else "CLIPLoader",
              "inputs": te_inputs},
    }  # fmt: skip
    clip = ["1", 0]
    if v.text_encoder:
        g["11"] = {
            "class_type": "FerryOffloadTextEncoder",
            "inputs": {"clip": clip, **_widgets(v)},
        }
        clip = ["11", 0]
    if v.model:
        inputs = {
            "unet_name": MODEL_FILE,
            "weight_dtype": "default",
            "quant_preset": "none",
            "cache": True,
        }
        g["2"] = {"class_type": "FerryLoadDiffusionModelQuantized", "inputs": inputs}
        g["12"] = {
            "class_type": "FerryOffloadModel",
            "inputs": {"model": ["2", 0], **_widgets(v)},
        }
        model = ["12", 0]
    else:
        g["2"] = {
            "class_type": "UNETLoader",
            "inputs": {"unet_name": MODEL_FILE, "weight_dtype": "default"},
        }
        model = ["2", 0]
    g["3"] = {"class_type": "CLIPTextEncode", "inputs": {"text": TEXT, "clip": clip}}
    g["4"] = {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["3", 0]}}
    g["5"] = {
        "class_type": "EmptySD3LatentImage",
        "inputs": {"width": size, "height": size, "batch_size": 1},
    }
    g["6"] = {
        "class_type": "KSampler",
        "inputs": {
            "model": model, "positive": ["3", 0], "negative": ["4", 0], "latent_image": ["5", 0],
            "seed": 11, "steps": steps, "cfg": 2.0, "sampler_name": "euler", "scheduler": "simple",
            "denoise": 1.0,
        },
    }  # fmt: skip
    g["7"] = {
        "class_type": "SaveLatent",
        "inputs": {"samples": ["6", 0], "filename_prefix": prefix},
    }
    g["8"] = {"class_type": "VAELoader", "inputs": {"vae_name": VAE_FILE}}
    g["9"] = {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["8", 0]}}
    g["10"] = {
        "class_type": "FerryTestSaveImage",
        "inputs": {"images": ["9", 0], "filename_prefix": f"{prefix}-image"},
    }
    return g


def outputs(base: Path, entry: dict[str, Any], prefix: str) -> dict[str, torch.Tensor]:
    """The latent and the decoded image a finished prompt of ``whole_graph`` saved."""
    from ferry_workflows import saved_latent_name
    from safetensors.torch import load_file

    latent = load_file(str(base / "output" / saved_latent_name(entry)))["latent_tensor"]
    image = load_file(str(base / "output" / f"{prefix}-image.safetensors"))["images"]
    return {"latent": latent, "image": image}
