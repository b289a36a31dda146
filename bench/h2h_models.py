"""Models for the ComfyUI head-to-head, written with ComfyUI's own network classes so the keys
and shapes are exactly what ComfyUI's model detection expects (run with ComfyUI importable):

    python -m bench.h2h_models <comfyui dir> <kind> <out.safetensors>   kind: flux-dev | sd3-tiny

- ``flux-dev``: full-size FLUX.1-dev shape (hidden 3072, 19 double + 38 single blocks, guidance
  embedding; ComfyUI v0.3.64 hard-codes these sizes, so a smaller Flux is not detected), bf16,
  random weights generated on the GPU (seconds) and saved to safetensors (~24 GB).
- ``sd3-tiny``: a 3-block MMDiT (SD3 architecture; ComfyUI reads its sizes from the shapes),
  fp32, for the CPU dry run. Same recipe as tests/comfyui/make_tiny_models.py.

Weights: normal with std 1/sqrt(fan_in), 1-d tensors 0.02 (norm scales 1): activations keep
their scale through every block, so the sampled latent stays finite.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

# What the worker needs to build inputs for each kind (saved beside the model as JSON).
KINDS: dict[str, dict[str, Any]] = {
    "flux-dev": {"latent": [1, 16, 128, 128], "context": [1, 256, 4096], "pooled": 768,
                 "guidance": 3.5},
    "sd3-tiny": {"latent": [1, 16, 16, 16], "context": [1, 8, 32], "pooled": 32},
}  # fmt: skip


def _init_(net: torch.nn.Module, seed: int) -> None:
    dev = next(net.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if p.dim() == 1:
                if name.endswith(".scale") or ("norm" in name and name.endswith("weight")):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02, generator=gen)
            else:
                fan_in = p[0].numel()
                p.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
        # MMDiT's pos_embed is a buffer created with torch.empty: garbage (NaN) unless set.
        for name, b in net.named_buffers():
            if name.endswith("pos_embed"):
                b.normal_(0.0, 0.02, generator=gen)


def build_flux_dev(device: str) -> torch.nn.Module:
    from comfy.ldm.flux.model import Flux

    with torch.device(device):
        net = Flux(
            image_model="flux", dtype=torch.bfloat16, device=device, operations=torch.nn,
            in_channels=16, out_channels=16, vec_in_dim=768, context_in_dim=4096,
            hidden_size=3072, mlp_ratio=4.0, num_heads=24, depth=19, depth_single_blocks=38,
            axes_dim=[16, 56, 56], theta=10000, patch_size=2, qkv_bias=True, guidance_embed=True,
        )  # fmt: skip
    return net.to(torch.bfloat16)


def build_sd3_tiny(device: str) -> torch.nn.Module:
    from comfy.ldm.modules.diffusionmodules.mmdit import MMDiT

    depth = 3  # ComfyUI reads depth as hidden_size / 64: hidden 192, 3 heads
    return MMDiT(
        input_size=None, patch_size=2, in_channels=16, out_channels=16, depth=depth,
        adm_in_channels=32,
        context_embedder_config={"target": "torch.nn.Linear",
                                 "params": {"in_features": 32, "out_features": 64 * depth}},
        pos_embed_max_size=16, num_patches=256, pos_embed_scaling_factor=None,
        dtype=torch.float32, device=device, operations=torch.nn,
    )  # fmt: skip


def write_model(comfy_dir: str, kind: str, out: Path) -> dict[str, Any]:
    """Builds ``kind`` with seeded random weights and saves it; returns its description."""
    if kind not in KINDS:
        raise SystemExit(f"unknown model kind {kind!r}; use one of {sorted(KINDS)}")
    sys.path.insert(0, comfy_dir)
    from safetensors.torch import save_file

    device = "cuda" if kind == "flux-dev" and torch.cuda.is_available() else "cpu"
    import comfy.cli_args

    comfy.cli_args.args.cpu = device == "cpu"  # before model_management imports: no CUDA probe
    t0 = time.perf_counter()
    net = build_flux_dev(device) if kind == "flux-dev" else build_sd3_tiny(device)
    torch.manual_seed(0)
    _init_(net, seed=0)
    sd = {k: v.detach().contiguous() for k, v in net.state_dict().items()}
    del net
    # The host copy of the whole model lives only in this short process (24 GB of 128 GB).
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    save_file({k: v.cpu() for k, v in sd.items()}, str(tmp))
    tmp.rename(out)
    info = {
        "kind": kind,
        "file": str(out),
        "params": sum(t.numel() for t in sd.values()),
        "bytes": out.stat().st_size,
        "make_s": round(time.perf_counter() - t0, 1),
        **KINDS[kind],
    }
    out.with_suffix(".json").write_text(json.dumps(info, indent=1))
    return info


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    print(json.dumps(write_model(sys.argv[1], sys.argv[2], Path(sys.argv[3]))))
