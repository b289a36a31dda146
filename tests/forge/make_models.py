"""Writes the Forge suite's models: full-size SD 1.5-shaped checkpoints and a LoRA, random weights.

    <forge python> make_models.py FORGE_CHECKOUT OUT_DIR

Run with Forge's own Python inside its checkout: the tensor names and shapes come from Forge's
own classes (its UNet, its VAE, transformers' CLIP text model with Forge's SD 1.5 configs),
built on the meta device, so the files are what Forge's loader expects and
huggingface_guess detects them as SD 1.5. The weights are random (seeded) and scaled so a
64x64 image is neither flat nor saturated. Tensors are written one at a time: the whole
checkpoint is never in RAM.

  ferry-sd15-a.safetensors  float32 (4.3 GB): on a CPU Forge keeps the UNet in float32, so its
                            bytes are the file's (Ferry's disk tier reads them from the file)
  ferry-sd15-b.safetensors  float16 (2.1 GB), other seed: Forge casts it, Ferry writes groups
  ferry-lora.safetensors    a rank-8 LoRA on every attention projection of the UNet
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from pathlib import Path

import torch

#: Bump when what this script writes changes: the suite rewrites cached files.
VERSION = 1
#: The same for the GGUF suite's files (``--gguf``).
GGUF_VERSION = 2

SD15_UNET = {
    "use_checkpoint": False, "out_channels": 4, "use_spatial_transformer": True,
    "adm_in_channels": None, "in_channels": 4, "model_channels": 320,
    "num_res_blocks": [2, 2, 2, 2], "transformer_depth": [1, 1, 1, 1, 1, 1, 0, 0],
    "channel_mult": [1, 2, 4, 4], "transformer_depth_middle": 1,
    "use_linear_in_transformer": False, "context_dim": 768, "num_heads": 8, "num_head_channels": -1,
    "transformer_depth_output": [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
}  # fmt: skip
DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.int64: "I64"}


def shapes(forge: Path) -> dict[str, tuple[tuple[int, ...], bool]]:
    """name -> (shape, is_float) for an SD 1.5 single-file checkpoint, from Forge's classes."""
    sys.path[:0] = [str(forge), str(forge / "packages_3rdparty")]
    sys.argv[1:] = ["--always-cpu"]  # backend.args parses the command line on import
    from backend.nn.unet import IntegratedUNet2DConditionModel
    from backend.nn.vae import IntegratedAutoencoderKL
    from transformers import CLIPTextConfig, CLIPTextModel

    repo = forge / "backend" / "huggingface" / "runwayml" / "stable-diffusion-v1-5"
    out: dict[str, tuple[tuple[int, ...], bool]] = {}
    with torch.device("meta"):
        unet = IntegratedUNet2DConditionModel(**SD15_UNET)
        vae = IntegratedAutoencoderKL.from_config(
            IntegratedAutoencoderKL.load_config(str(repo / "vae"))
        )
        clip = CLIPTextModel(CLIPTextConfig.from_pretrained(str(repo / "text_encoder")))
    for prefix, module in (
        ("model.diffusion_model.", unet),
        ("first_stage_model.", vae),
        ("cond_stage_model.transformer.", clip),
    ):
        for k, t in module.state_dict().items():
            out[prefix + k] = (tuple(t.shape), t.is_floating_point())
    return out


def init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Random, variance-keeping weights: conv/linear N(0, 1/fan_in), norms near 1, small biases."""
    if len(shape) >= 2:
        fan_in = math.prod(shape[1:])
        scale = 1.0 / math.sqrt(fan_in)
        if "embedding" in name:
            scale = 0.02
        if name.endswith(("decoder.conv_out.weight", "out.2.weight")):
            scale *= 0.5  # the image and the noise prediction stay in range
        return torch.randn(shape, generator=g) * scale
    if name.endswith(".weight"):  # norms
        return 1.0 + 0.05 * torch.randn(shape, generator=g)
    return 0.02 * torch.randn(shape, generator=g)


def write(path: Path, tensors: dict[str, tuple[tuple[int, ...], torch.dtype]], fill) -> None:
    """A safetensors file written tensor by tensor (header first, then each tensor's bytes)."""
    header: dict[str, object] = {
        "__metadata__": {"format": "pt", "ferry_test_models": str(VERSION)}
    }
    offset = 0
    for name, (shape, dtype) in tensors.items():
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        header[name] = {
            "dtype": DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, (shape, dtype) in tensors.items():
            t = fill(name, shape).to(dtype).contiguous()
            f.write(t.numpy().tobytes())
    os.replace(tmp, path)


def checkpoint(forge: Path, path: Path, dtype: torch.dtype, seed: int) -> None:
    spec = shapes(forge)
    g = torch.Generator().manual_seed(seed)

    def fill(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name.endswith("position_ids"):
            return torch.arange(shape[-1]).reshape(shape)
        return init(name, shape, g)

    tensors = {n: (s, dtype if is_float else torch.int64) for n, (s, is_float) in spec.items()}
    write(path, tensors, fill)


def lora(forge: Path, path: Path, seed: int, rank: int = 8) -> None:
    spec = shapes(forge)
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for name, (shape, _) in spec.items():
        if not name.startswith("model.diffusion_model.") or len(shape) != 2:
            continue
        if not any(p in name for p in (".to_q.", ".to_k.", ".to_v.", ".to_out.0.")):
            continue
        key = "lora_unet_" + name[len("model.diffusion_model.") : -len(".weight")].replace(".", "_")
        out_f, in_f = shape
        tensors[key + ".lora_down.weight"] = ((rank, in_f), torch.float16)
        tensors[key + ".lora_up.weight"] = ((out_f, rank), torch.float16)
        tensors[key + ".alpha"] = ((), torch.float16)

    def fill(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name.endswith(".alpha"):
            return torch.tensor(float(rank))
        return torch.randn(shape, generator=g) * (0.5 / math.sqrt(shape[-1]))

    write(path, tensors, fill)


def gguf_checkpoint(forge: Path, path: Path, vae_te: Path, seed: int) -> None:
    """An SD 1.5 UNet as a GGUF file, as people load one in Forge (a UNet-only .gguf, the VAE
    and text encoder from a safetensors file chosen as an additional module): the UNet's 2-D
    (Linear) weights Q8_0, the rest F32, written with the gguf package Forge ships
    (packages_3rdparty/gguf); the VAE and text encoder F32. (A single .gguf holding the text
    encoder too does not load in this Forge with torch 2.13: its CLIP loader wraps each
    ParameterGGUF in a new Parameter, which torch refuses.)"""
    spec = shapes(forge)  # puts Forge's packages_3rdparty first on sys.path
    import gguf
    import numpy as np

    g = torch.Generator().manual_seed(seed)
    values = {}
    for name, (shape, is_float) in spec.items():
        if is_float:
            values[name] = init(name, shape, g)
        else:
            values[name] = torch.arange(shape[-1]).reshape(shape)
    writer = gguf.GGUFWriter(str(path.with_suffix(".tmp")), "ferry-test")
    for name, t in values.items():
        if not name.startswith("model.diffusion_model."):
            continue
        a = t.numpy().astype(np.float32)
        if t.dim() == 2 and t.shape[-1] % 32 == 0:
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, a)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(path.with_suffix(".tmp"), path)
    rest = {
        n: (tuple(t.shape), torch.float32 if t.is_floating_point() else torch.int64)
        for n, t in values.items()
        if not n.startswith("model.diffusion_model.")
    }
    write(vae_te, rest, lambda name, shape: values[name])


def main() -> None:
    if sys.argv[1] == "--gguf":  # the GGUF suite's models only (test_forge_gguf.py)
        forge, out = Path(sys.argv[2]).resolve(), Path(sys.argv[3])
        (out / "Stable-diffusion").mkdir(parents=True, exist_ok=True)
        (out / "Lora").mkdir(parents=True, exist_ok=True)
        (out / "VAE").mkdir(parents=True, exist_ok=True)
        gguf_checkpoint(
            forge, out / "Stable-diffusion" / "ferry-sd15-q8.gguf",
            out / "VAE" / "ferry-sd15-vae-te.safetensors", 4,
        )  # fmt: skip
        lora(forge, out / "Lora" / "ferry-lora.safetensors", 3)
        (out / "VERSION").write_text(str(GGUF_VERSION))
        return
    forge, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    (out / "Stable-diffusion").mkdir(parents=True, exist_ok=True)
    (out / "Lora").mkdir(parents=True, exist_ok=True)
    checkpoint(forge, out / "Stable-diffusion" / "ferry-sd15-a.safetensors", torch.float32, 1)
    checkpoint(forge, out / "Stable-diffusion" / "ferry-sd15-b.safetensors", torch.float16, 2)
    lora(forge, out / "Lora" / "ferry-lora.safetensors", 3)
    (out / "VERSION").write_text(str(VERSION))


if __name__ == "__main__":
    main()
