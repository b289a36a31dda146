"""Writes a tiny MMDiT (SD3 architecture) with random weights, and a LoRA for it; and the same
model as a checkpoint (under ``model.diffusion_model.``, which Ferry's quantized loader leaves to
ComfyUI's loader) and in ComfyUI's two fp8 formats: legacy ``fp8_scaled`` (``scaled_fp8`` +
``scale_weight``) and ``comfy_quant`` (per-layer ``comfy_quant`` + ``weight_scale``).

Run with ComfyUI's Python (it builds the network with ComfyUI's own MMDiT class, so the keys
are exactly what ComfyUI's model detection expects):

    python make_tiny_models.py <comfyui checkout> <models dir>
"""

from __future__ import annotations

import json
import os
import sys

FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


def main(comfy_dir: str, models_dir: str) -> None:
    sys.path.insert(0, comfy_dir)
    import comfy.cli_args
    import torch
    from safetensors.torch import save_file

    comfy.cli_args.args.cpu = True  # before comfy.model_management is imported: no CUDA probe
    from comfy.ldm.modules.diffusionmodules.mmdit import MMDiT

    torch.manual_seed(0)
    depth = 3  # ComfyUI reads depth as hidden_size / 64: hidden 192, 3 heads, 3 joint blocks
    net = MMDiT(
        input_size=None,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        depth=depth,
        adm_in_channels=32,
        context_embedder_config={
            "target": "torch.nn.Linear",
            "params": {"in_features": 32, "out_features": 64 * depth},
        },
        pos_embed_max_size=16,
        num_patches=256,
        pos_embed_scaling_factor=None,
        dtype=torch.float32,
        device="cpu",
        operations=torch.nn,  # torch's own layers: initialised (ComfyUI's skip init)
    )
    sd = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
    # pos_embed is a parameter created empty; give it small values.
    sd["pos_embed"] = torch.randn_like(sd["pos_embed"]) * 0.02
    dm = os.path.join(models_dir, "diffusion_models")
    os.makedirs(dm, exist_ok=True)
    save_file(sd, os.path.join(dm, "ferry-tiny-sd3.safetensors"))
    prefixed = {f"model.diffusion_model.{k}": v for k, v in sd.items()}
    save_file(prefixed, os.path.join(dm, "ferry-tiny-sd3-prefixed.safetensors"))
    save_file(fp8_scaled(sd), os.path.join(dm, "ferry-tiny-sd3-fp8scaled.safetensors"))
    save_file(comfy_quant(sd), os.path.join(dm, "ferry-tiny-sd3-comfyquant.safetensors"))

    lora = {}
    rank = 4
    for key in ("joint_blocks_0_x_block_attn_qkv", "joint_blocks_1_context_block_mlp_fc1"):
        name = key.replace("joint_blocks_", "joint_blocks.").replace("_x_block_", ".x_block.")
        name = name.replace("_context_block_", ".context_block.").replace("attn_qkv", "attn.qkv")
        name = name.replace("mlp_fc1", "mlp.fc1")
        w = sd[name + ".weight"]
        lora[f"lora_unet_{key}.lora_up.weight"] = torch.randn(w.shape[0], rank) * 0.1
        lora[f"lora_unet_{key}.lora_down.weight"] = torch.randn(rank, w.shape[1]) * 0.1
        lora[f"lora_unet_{key}.alpha"] = torch.tensor(float(rank))
    lo = os.path.join(models_dir, "loras")
    os.makedirs(lo, exist_ok=True)
    save_file(lora, os.path.join(lo, "ferry-tiny-lora.safetensors"))
    print(f"wrote {len(sd)} tensors, {sum(t.numel() for t in sd.values())} parameters")


def _fp8(w):  # (weight in float8_e4m3fn, its per-tensor scale)
    import torch

    scale = (w.abs().max() / FP8_MAX).clamp(min=1e-12).float()
    return (w / scale).to(torch.float8_e4m3fn), scale


def _blocks_linear(sd):
    return [k for k, v in sd.items() if k.startswith("joint_blocks.") and v.dim() == 2]


def fp8_scaled(sd):
    """ComfyUI's legacy fp8_scaled checkpoint: fp8 weights, ``<layer>.scale_weight``, and the
    ``scaled_fp8`` marker (empty: matmuls at full precision)."""
    import torch

    out = dict(sd)
    for k in _blocks_linear(sd):
        out[k], out[k[: -len("weight")] + "scale_weight"] = _fp8(sd[k])
    out["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return out


def comfy_quant(sd):
    """ComfyUI's mixed-precision checkpoint: fp8 weights, ``<layer>.weight_scale`` and a
    ``<layer>.comfy_quant`` JSON config per quantized layer."""
    import torch

    out = dict(sd)
    conf = list(json.dumps({"format": "float8_e4m3fn"}).encode())
    for k in _blocks_linear(sd):
        layer = k[: -len(".weight")]
        out[k], out[layer + ".weight_scale"] = _fp8(sd[k])
        out[layer + ".comfy_quant"] = torch.tensor(conf, dtype=torch.uint8)
    return out


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
