"""Writes the rest of a whole graph around make_text_encoders.py's big T5 (issue 29): an
SD3-shaped diffusion model (core's MMDiT) whose text input is that T5's width, and an SD3-shaped
VAE (core's 16-channel AutoencodingEngine at the sizes core's VAELoader builds for it). Run with
ComfyUI's Python after ``make_text_encoders.py --big``:

    python make_whole_graph.py <comfyui checkout> <models dir> <depth>

The T5 is bigger than the diffusion model, as a UMT5-XXL is beside a Wan 2.1 1.3B or a
Mistral 3 24B beside Flux.2: depth 10 is a 0.6 GB float32 MMDiT beside a 2.5 GB T5
(``--big-layers=36``). CLIPLoader
type sd3 with only a T5 gives SD3's conditioning (context 77 x the T5's width, pooled 2048), so
the MMDiT's context embedder takes the T5's width (read from the T5 file's metadata: it depends
on which sizes this core detects as T5-XXL) and its pooled embedder 2048. Each tensor is written
as it is made (never the whole network in RAM); the VAE is about 84 M values of float16.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_text_encoders import BIG_T5XXL_FILE, META_KEY  # noqa: E402

MODEL_FILE = "ferry-graph-sd3.safetensors"
VAE_FILE = "ferry-graph-vae.safetensors"
POOLED = 768 + 1280  # SD3's pooled width: CLIP-L's and CLIP-G's, zeros when only a T5 is loaded


def t5_width(models_dir: str, name: str = BIG_T5XXL_FILE) -> int:
    """The width of the T5 text_encoders/``name`` (make_text_encoders.py's metadata)."""
    from safetensors import safe_open

    path = os.path.join(models_dir, "text_encoders", name)
    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
    return int(json.loads(meta[META_KEY])["t5xxl_model_config"]["d_model"])


def _values(shapes: dict, seed: int, norm_ones: bool):  # type: ignore[no-untyped-def]
    """Seeded values, scaled by fan-in so the activations stay finite through every layer;
    a VAE's norms start at one and its biases at zero, as a trained one's are near."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    for k, shape in shapes.items():
        if norm_ones and len(shape) == 1:
            yield (
                k,
                torch.ones(shape) if ".norm" in k and k.endswith("weight") else torch.zeros(shape),
            )
            continue
        fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[-1]
        scale = 0.02 if len(shape) < 2 or k == "pos_embed" else 1.0 / math.sqrt(fan_in)
        yield k, torch.randn(shape, generator=gen) * scale


def main(comfy_dir: str, models_dir: str, depth: int) -> None:
    sys.path.insert(0, comfy_dir)
    sys.path.insert(0, str(REPO))
    import comfy.cli_args

    comfy.cli_args.args.cpu = True
    write_mmdit(models_dir, MODEL_FILE, depth, t5_width(models_dir), POOLED)
    write_vae(models_dir)


def write_mmdit(models_dir: str, name: str, depth: int, width: int, pooled: int) -> None:
    """An SD3-shaped diffusion model (core's MMDiT, hidden 64 x ``depth``) taking a ``width``
    wide text context and a ``pooled`` wide pooled vector, in diffusion_models/``name``."""
    import torch
    from comfy.ldm.modules.diffusionmodules.mmdit import MMDiT

    from offload_core.formats.safetensors import write_file

    with torch.device("meta"):
        net = MMDiT(
            input_size=None, patch_size=2, in_channels=16, out_channels=16, depth=depth,
            adm_in_channels=pooled,
            context_embedder_config={
                "target": "torch.nn.Linear",
                "params": {"in_features": width, "out_features": 64 * depth},
            },
            pos_embed_max_size=16, num_patches=256, pos_embed_scaling_factor=None,
            dtype=torch.float32, device="meta", operations=torch.nn,
        )  # fmt: skip
    shapes = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    dm = os.path.join(models_dir, "diffusion_models")
    os.makedirs(dm, exist_ok=True)
    with open(os.path.join(dm, name), "wb") as f:
        write_file(
            f, [(k, torch.float32, s) for k, s in shapes.items()], {}, _values(shapes, 0, False)
        )
    print(f"{name}: depth {depth}, context {width}, {sum(map(math.prod, shapes.values()))} values")


def write_vae(models_dir: str, name: str = VAE_FILE) -> None:
    """An SD3-shaped VAE (16 latent channels, as Flux's ae.safetensors) in vae/``name``. Run
    with ComfyUI's Python, ``comfy`` importable (main() or make_template_models.py set it up)."""
    import torch
    from comfy.ldm.models.autoencoder import AutoencodingEngine

    from offload_core.formats.safetensors import write_file

    # What core's VAE() builds for a 16-channel "decoder.conv_in" without post_quant_conv.
    ddconfig = {
        "double_z": True, "z_channels": 16, "resolution": 256, "in_channels": 3, "out_ch": 3,
        "ch": 128, "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [],
        "dropout": 0.0,
    }  # fmt: skip
    with torch.device("meta"):
        vae = AutoencodingEngine(
            regularizer_config={
                "target": "comfy.ldm.models.autoencoder.DiagonalGaussianRegularizer"
            },
            encoder_config={
                "target": "comfy.ldm.modules.diffusionmodules.model.Encoder",
                "params": ddconfig,
            },
            decoder_config={
                "target": "comfy.ldm.modules.diffusionmodules.model.Decoder",
                "params": ddconfig,
            },
        )
    shapes = {k: tuple(v.shape) for k, v in vae.state_dict().items()}
    os.makedirs(os.path.join(models_dir, "vae"), exist_ok=True)
    with open(os.path.join(models_dir, "vae", name), "wb") as f:
        values = ((k, v.to(torch.float16)) for k, v in _values(shapes, 1, True))
        write_file(f, [(k, torch.float16, s) for k, s in shapes.items()], {}, values)
    print(f"{name}: {sum(map(math.prod, shapes.values()))} values")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
