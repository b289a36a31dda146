"""Tiny random diffusion models of the architectures ComfyUI core runs, one file per
architecture, for the architecture sweep (test_comfyui_arch_sweep.py).

Each is built by core's own model config (``comfy.model_detection.model_config_from_unet_config``
of a small ``unet_config``, then ``get_model``), so its keys are exactly core's; its parameters
are seeded random numbers (per key, so a file is the same whatever else is built), saved in
bf16 under ``models/diffusion_models/ferry-arch-<name>.safetensors``. A model is kept only
when core's detection, reading the saved file, picks the same model config and builds a
network of exactly the saved keys and shapes: where detection fixes a size (a hidden width,
a block count or a text width written into core), the file is built at that size, and an
architecture whose fixed sizes make it too big to be tiny is not built (``SKIP``, with why).

Run with ComfyUI's Python; writes ``<models dir>/arch-sweep.json``: per architecture its
file, latent shape and conditioning, or why it was not built in this core:

    python make_arch_models.py <comfyui checkout> <models dir> [name ...]
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from typing import Any

# A fixed T5/Qwen-style text width several of core's configs write in.
_C1024 = 1024

#: name -> (core's model config class, unet_config as core's detection reads it from the
#: file, conditioning {tokens, dim, pooled}, latent shape without the batch). The sizes
#: detection derives from tensor shapes are small; the ones it fixes are core's.
ARCHS: dict[str, dict[str, Any]] = {
    "hunyuan_video_1.5": {
        "config": "HunyuanVideo15",
        "unet": {
            "image_model": "hunyuan_video", "in_channels": 65, "patch_size": [1, 1, 1],
            "out_channels": 32, "vec_in_dim": None, "axes_dim": [16, 56, 56], "meanflow": False,
            "context_in_dim": 32, "hidden_size": 128, "mlp_ratio": 4.0, "num_heads": 1,
            "depth": 2, "depth_single_blocks": 2, "theta": 256, "qkv_bias": True, "byt5": False,
            "guidance_embed": False, "use_cond_type_embedding": True, "vision_in_dim": 1152,
            "meanflow_sum": True,
        },
        # core's HunyuanVideo asks for a pooled output (its vector_in's, unused without one)
        "cond": {"tokens": 8, "dim": 32, "pooled": 768},
        "latent": [32, 1, 8, 8],
    },
    "cosmos_predict2": {
        "config": "CosmosT2IPredict2",
        "unet": {
            "image_model": "cosmos_predict2", "max_img_h": 240, "max_img_w": 240,
            "max_frames": 128, "in_channels": 16, "out_channels": 16, "patch_spatial": 2,
            "patch_temporal": 1, "model_channels": 192, "concat_padding_mask": True,
            "crossattn_emb_channels": _C1024, "pos_emb_cls": "rope3d",
            "pos_emb_learnable": True, "pos_emb_interpolation": "crop", "min_fps": 1,
            "max_fps": 30, "use_adaln_lora": True, "adaln_lora_dim": 256, "num_blocks": 2,
            "extra_per_block_abs_pos_emb": False, "rope_h_extrapolation_ratio": 4.0,
            "rope_w_extrapolation_ratio": 4.0, "rope_t_extrapolation_ratio": 1.0,
            "extra_h_extrapolation_ratio": 1.0, "extra_w_extrapolation_ratio": 1.0,
            "extra_t_extrapolation_ratio": 1.0, "rope_enable_fps_modulation": False,
        },
        "cond": {"tokens": 8, "dim": _C1024, "pooled": 0},
        "latent": [16, 1, 8, 8],
    },
}  # fmt: skip
ARCHS["anima"] = {
    **ARCHS["cosmos_predict2"],
    "config": "Anima",
    "unet": {**ARCHS["cosmos_predict2"]["unet"], "image_model": "anima"},
}
ARCHS["cosmos_1"] = {
    "config": "CosmosT2V",
    # Not 4096 wide: core's detection then takes the 14B layout (36 blocks, 40 heads, learnable
    # per-block position embeddings); 480 wide gives 12-wide heads, the least its rope splits
    # (a third of a head each for height and width, at least 4 wide).
    "unet": {
        "image_model": "cosmos", "max_img_h": 240, "max_img_w": 240, "max_frames": 128,
        "in_channels": 16, "out_channels": 16, "patch_spatial": 2, "patch_temporal": 1,
        "model_channels": 480, "block_config": "FA-CA-MLP", "concat_padding_mask": True,
        "pos_emb_cls": "rope3d", "pos_emb_learnable": False, "pos_emb_interpolation": "crop",
        "block_x_format": "THWBD", "affline_emb_norm": True, "use_adaln_lora": True,
        "adaln_lora_dim": 256, "num_blocks": 36, "num_heads": 40,
        "extra_per_block_abs_pos_emb": True, "rope_h_extrapolation_ratio": 2.0,
        "rope_w_extrapolation_ratio": 2.0, "rope_t_extrapolation_ratio": 2.0,
        "extra_h_extrapolation_ratio": 2.0, "extra_w_extrapolation_ratio": 2.0,
        "extra_t_extrapolation_ratio": 2.0, "extra_per_block_abs_pos_emb_type": "learnable",
    },
    "cond": {"tokens": 8, "dim": _C1024, "pooled": 0},
    "latent": [16, 1, 8, 8],
}  # fmt: skip

#: Architectures core runs that the sweep does not build, and why.
SKIP: dict[str, str] = {}


def main(comfy_dir: str, models_dir: str, names: list[str]) -> None:
    sys.path.insert(0, comfy_dir)
    import comfy.cli_args

    comfy.cli_args.args.cpu = True  # before comfy.model_management is imported: no CUDA probe
    out: dict[str, dict[str, Any]] = {}
    dm = os.path.join(models_dir, "diffusion_models")
    os.makedirs(dm, exist_ok=True)
    for name in names or list(ARCHS):
        spec = ARCHS[name]
        try:
            out[name] = build(name, spec, dm)
        except Exception as e:  # reported per architecture: the sweep goes on
            out[name] = {"skip": f"not built in this core: {type(e).__name__}: {e}"}
        print(name, out[name].get("skip") or out[name]["file"], flush=True)
    for name, why in SKIP.items():
        out.setdefault(name, {"skip": why})
    with open(os.path.join(models_dir, "arch-sweep.json"), "w") as f:
        json.dump(out, f, indent=1)


def build(name: str, spec: dict[str, Any], dm: str) -> dict[str, Any]:
    import comfy.model_detection
    import comfy.supported_models
    import torch
    from safetensors.torch import save_file

    if not hasattr(comfy.supported_models, spec["config"]):
        return {"skip": f"this core has no {spec['config']}"}
    config = comfy.model_detection.model_config_from_unet_config(dict(spec["unet"]))
    if type(config).__name__ != spec["config"]:
        return {"skip": f"core took the config for {type(config).__name__}"}
    config.set_inference_dtype(torch.float32, None)
    net = config.get_model({}, "").diffusion_model
    params = dict(net.named_parameters())
    sd = {}
    for k, v in net.state_dict().items():
        if k in params:
            v = _random(k, tuple(v.shape))
        sd[k] = v.detach().to(torch.bfloat16 if v.is_floating_point() else v.dtype).contiguous()
    why = _detected_differently(sd, spec["config"])
    if why:
        return {"skip": why}
    file = f"ferry-arch-{name}.safetensors"
    save_file(sd, os.path.join(dm, file))
    return {"file": file, "cond": spec["cond"], "latent": spec["latent"]}


def _random(key: str, shape: tuple[int, ...]) -> Any:
    """Seeded by the key: norms near 1, biases and 1-D tensors small, matrices 1/sqrt(fan-in)."""
    import torch

    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    t = torch.randn(shape, generator=g)
    if len(shape) >= 2:
        return t / (max(1, t[0].numel()) ** 0.5)
    if key.endswith((".weight", ".scale", "gamma")):
        return 1.0 + 0.05 * t
    return 0.02 * t


def _detected_differently(sd: dict[str, Any], want: str) -> str | None:
    """Why core's detection of ``sd`` would not rebuild this network (None: it would)."""
    import comfy.model_detection
    import torch

    config = comfy.model_detection.model_config_from_unet(sd, "")
    got = type(config).__name__ if config is not None else None
    if got != want:
        return f"core's detection takes this file for {got}, not {want}"
    config.set_inference_dtype(torch.bfloat16, None)
    again = config.get_model({}, "", device=torch.device("meta")).diffusion_model.state_dict()
    loaded = config.process_unet_state_dict(dict(sd))
    shapes = {k: tuple(v.shape) for k, v in again.items()}
    ours = {k: tuple(v.shape) for k, v in loaded.items()}
    if shapes != ours:
        diff = sorted(set(shapes.items()) ^ set(ours.items()))[:3]
        return f"core's detection builds other shapes from this file: {diff}"
    return None


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
