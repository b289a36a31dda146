"""Writes a tiny MMDiT (SD3 architecture) with random weights, and a LoRA for it.

Run with ComfyUI's Python (it builds the network with ComfyUI's own MMDiT class, so the keys
are exactly what ComfyUI's model detection expects):

    python make_tiny_models.py <comfyui checkout> <models dir>
"""

from __future__ import annotations

import os
import sys


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


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
