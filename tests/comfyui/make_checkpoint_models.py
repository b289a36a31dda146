"""Writes SDXL-shaped all-in-one checkpoints with random weights, keyed and shaped as core's
own ``save_checkpoint`` writes them (core's classes built on meta, their state dicts passed
through core's ``state_dict_for_saving``: the diffusion model under "model.diffusion_model.",
CLIP-L and OpenCLIP-G under "conditioner.embedders.", the VAE under "first_stage_model."),
one tensor at a time (never the model in RAM). Run with ComfyUI's Python:

    python make_checkpoint_models.py <comfyui checkout> <models dir>

Two files: CKPT_FILE (everything float16: 6.9 GB) and FP8_FILE (the same values, the diffusion
model's stored as float8_e4m3fn: 4.3 GB, as the fp8 all-in-one files users download). A file
already there with the size this script writes is kept (the tests reuse them across runs).
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CKPT_FILE = "ferry-sdxl-ckpt.safetensors"
FP8_FILE = "ferry-sdxl-ckpt-fp8.safetensors"
#: A folder to write the files into once and reuse across runs (7 + 4.4 GB), linked into each
#: base's models/checkpoints; unset: written into models/checkpoints.
CACHE_ENV = "FERRY_CHECKPOINT_CACHE"
DM = "model.diffusion_model."
#: SDXL's diffusion model as core's detection reads it (comfy/model_detection.py's SDXL).
SDXL_UNET = {
    "use_checkpoint": False, "image_size": 32, "out_channels": 4, "use_spatial_transformer": True,
    "legacy": False, "num_classes": "sequential", "adm_in_channels": 2816, "in_channels": 4,
    "model_channels": 320, "num_res_blocks": [2, 2, 2], "transformer_depth": [0, 0, 2, 2, 10, 10],
    "channel_mult": [1, 2, 4], "transformer_depth_middle": 10, "use_linear_in_transformer": True,
    "context_dim": 2048, "num_head_channels": 64,
    "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10],
    "use_temporal_attention": False, "use_temporal_resblock": False,
}  # fmt: skip
#: SD's VAE (comfy/sd.py's default AutoencoderKL).
VAE_CONFIG = {
    "double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3,
    "ch": 128, "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [],
    "dropout": 0.0,
}  # fmt: skip


def checkpoint_on_meta() -> dict[str, object]:
    """The checkpoint's state dict as core saves it, its float tensors on meta."""
    import comfy.model_detection
    import torch
    from comfy.ldm.models.autoencoder import AutoencoderKL

    config = comfy.model_detection.model_config_from_unet_config(
        {**SDXL_UNET, "dtype": torch.float16}
    )
    assert type(config).__name__ == "SDXL", type(config).__name__
    config.set_inference_dtype(torch.float16, None)
    base = config.get_model({}, "", device="meta")
    clip = config.clip_target().clip(device="meta", dtype=torch.float16)
    with torch.device("meta"):
        vae = AutoencoderKL(ddconfig=VAE_CONFIG, embed_dim=4)
    parts = {"clip_state_dict": clip.state_dict(), "vae_state_dict": vae.state_dict()}
    # v0.33 is given the diffusion model's state dict; v0.3.64 reads its own.
    if "unet_state_dict" in inspect.signature(base.state_dict_for_saving).parameters:
        parts["unet_state_dict"] = base.diffusion_model.state_dict()
    sd = dict(base.state_dict_for_saving(**parts))
    assert any(k.startswith("first_stage_model.decoder.") for k in sd), "the VAE under its prefix"
    assert any(k.startswith(DM) for k in sd) and any(k.startswith("conditioner.") for k in sd)
    return sd


def _value(key: str, t: object) -> object:
    """A random value for ``key`` (seeded by its name, so both files hold the same values)."""
    import torch

    assert isinstance(t, torch.Tensor)
    if t.device.type != "meta":  # position ids and such: core's own values
        return t.contiguous()
    gen = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    shape = tuple(t.shape)
    if len(shape) >= 2:
        out = torch.randn(shape, generator=gen) / math.sqrt(math.prod(shape[1:]))
    elif key.endswith("weight") and ("norm" in key or "ln_" in key):
        out = 1.0 + 0.02 * torch.randn(shape, generator=gen)
    else:
        out = 0.02 * torch.randn(shape, generator=gen)
    return out


def write(path: str, sd: dict[str, object], fp8: bool) -> None:
    import torch

    from offload_core.formats.safetensors import write_file

    def dtype(key: str, t: torch.Tensor) -> torch.dtype:
        if not t.dtype.is_floating_point:
            return t.dtype
        return torch.float8_e4m3fn if fp8 and key.startswith(DM) else torch.float16

    specs = [(k, dtype(k, t), tuple(t.shape)) for k, t in sd.items()]  # type: ignore[union-attr]

    def tensors():  # type: ignore[no-untyped-def]
        for (k, dt, _), t in zip(specs, sd.values()):
            yield k, _value(k, t).to(dt)  # type: ignore[union-attr]

    tmp = path + ".part"
    with open(tmp, "wb") as f:
        write_file(f, specs, {}, tensors())
    os.replace(tmp, path)


def main(comfy_dir: str, models_dir: str) -> None:
    sys.path.insert(0, comfy_dir)
    sys.path.insert(0, str(REPO))
    import comfy.cli_args

    comfy.cli_args.args.cpu = True
    sd = checkpoint_on_meta()
    checkpoints = os.path.join(models_dir, "checkpoints")
    out_dir = os.environ.get(CACHE_ENV) or checkpoints
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(checkpoints, exist_ok=True)
    for name, fp8 in ((CKPT_FILE, False), (FP8_FILE, True)):
        path = os.path.join(out_dir, name)
        # Written under a temporary name and renamed when whole: one there is whole (whichever
        # core's classes wrote it: the tests' references are computed from the file there).
        if os.path.exists(path):
            print(f"kept {path}")
        else:
            write(path, sd, fp8)
            print(f"wrote {path}: {os.path.getsize(path) / 1e9:.2f} GB")
        if out_dir != checkpoints:
            os.symlink(path, os.path.join(checkpoints, name))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
