"""Writes an MMDiT (SD3 architecture) of a given depth with random weights, one tensor at a
time (never the whole model in RAM), and a LoRA for it. Run with ComfyUI's Python:

    python make_big_model.py <comfyui checkout> <models dir> <depth>

ComfyUI reads hidden = 64 x depth from the shapes, so depth 13 is ~1.3 GB in float32. The
context (8 x 32) and pooled (32) sizes match ferry_test_nodes.py's conditioning.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL_FILE = "ferry-big-sd3.safetensors"
LORA_FILE = "ferry-big-lora.safetensors"


def main(comfy_dir: str, models_dir: str, depth: int) -> None:
    sys.path.insert(0, comfy_dir)
    sys.path.insert(0, str(REPO))
    import comfy.cli_args
    import torch
    from safetensors.torch import save_file

    from offload_core.formats.safetensors import write_file

    comfy.cli_args.args.cpu = True
    from comfy.ldm.modules.diffusionmodules.mmdit import MMDiT

    with torch.device("meta"):
        net = MMDiT(
            input_size=None, patch_size=2, in_channels=16, out_channels=16, depth=depth,
            adm_in_channels=32,
            context_embedder_config={
                "target": "torch.nn.Linear",
                "params": {"in_features": 32, "out_features": 64 * depth},
            },
            pos_embed_max_size=16, num_patches=256, pos_embed_scaling_factor=None,
            dtype=torch.float32, device="meta", operations=torch.nn,
        )  # fmt: skip
    shapes = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    gen = torch.Generator().manual_seed(0)

    def tensors():  # type: ignore[no-untyped-def]
        for k, shape in shapes.items():
            scale = 0.02 if len(shape) < 2 or k == "pos_embed" else 1.0 / math.sqrt(shape[-1])
            yield k, torch.randn(shape, generator=gen) * scale

    dm = os.path.join(models_dir, "diffusion_models")
    os.makedirs(dm, exist_ok=True)
    with open(os.path.join(dm, MODEL_FILE), "wb") as f:
        write_file(f, [(k, torch.float32, s) for k, s in shapes.items()], {}, tensors())
    lora = {}
    for i in range(depth):  # every block's x attention: the patch touches every group
        w = shapes[f"joint_blocks.{i}.x_block.attn.qkv.weight"]
        key = f"lora_unet_joint_blocks_{i}_x_block_attn_qkv"
        lora[f"{key}.lora_up.weight"] = torch.randn(w[0], 4, generator=gen) * 0.1
        lora[f"{key}.lora_down.weight"] = torch.randn(4, w[1], generator=gen) * 0.1
        lora[f"{key}.alpha"] = torch.tensor(4.0)
    lo = os.path.join(models_dir, "loras")
    os.makedirs(lo, exist_ok=True)
    save_file(lora, os.path.join(lo, LORA_FILE))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
