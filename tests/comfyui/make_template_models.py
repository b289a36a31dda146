"""Writes what the shipped templates (example_workflows/) need to load and run here, after
make_tiny_models.py and make_text_encoders.py have run:

- ``diffusion_models/ferry-template-mmdit.safetensors``: a tiny SD3 (core's MMDiT) that takes
  Flux's conditioning from the tiny encoders: the T5's context (its width is what this core
  detects as T5-XXL: make_text_encoders.py) and CLIP-L's pooled vector (32 wide);
- ``vae/ferry-tiny-flux-vae.safetensors``: a 16-channel VAE (core's AutoencodingEngine at the
  sizes its VAELoader builds for Flux's and SD3's ae: make_whole_graph.write_vae);
- a stand-in under each model name a template names (``flux1-dev.safetensors``,
  ``umt5_xxl_fp16.safetensors``, …: a safetensors file with no tensors, an empty .gguf), so the
  frontend finds every name it checks a loader's value against; a run puts the tiny models'
  names in their place first.

    python make_template_models.py <comfyui checkout> <models dir> <template json>...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[2]

VAE_FILE = "ferry-tiny-flux-vae.safetensors"
MODEL_FILE = "ferry-template-mmdit.safetensors"
T5_FILE = "ferry-tiny-t5xxl.safetensors"  # make_text_encoders.py's
#: The folder each loader's file widgets read from (core's and ComfyUI-GGUF's names).
FOLDERS = {
    "UNETLoader": ("diffusion_models",),
    "FerryLoadDiffusionModelQuantized": ("diffusion_models",),
    "UnetLoaderGGUF": ("unet",),
    "DualCLIPLoader": ("text_encoders", "text_encoders"),
    "FerryLoadTextEncoderDual": ("text_encoders", "text_encoders"),
    "CLIPLoader": ("text_encoders",),
    "FerryLoadTextEncoder": ("text_encoders",),
    "VAELoader": ("vae",),
    "FerryLoadCheckpoint": ("checkpoints",),
}


def named_files(template: dict) -> set[tuple[str, str]]:
    """(folder, file name) of every model file the template's loaders name."""
    out = set()
    for node in template["nodes"]:
        for folder, name in zip(FOLDERS.get(node["type"], ()), node["widgets_values"]):
            out.add((folder, name))
    return out


def main(comfy_dir: str, models_dir: str, templates: list[str]) -> None:
    sys.path.insert(0, comfy_dir)
    sys.path.insert(0, str(REPO))
    import comfy.cli_args

    comfy.cli_args.args.cpu = True
    from make_text_encoders import CLIP_L
    from make_whole_graph import t5_width, write_mmdit, write_vae
    from safetensors.torch import save_file

    pooled = CLIP_L["projection_dim"]  # Flux's pooled vector is CLIP-L's projection
    write_mmdit(models_dir, MODEL_FILE, 3, t5_width(models_dir, T5_FILE), pooled)
    write_vae(models_dir, VAE_FILE)
    for path in templates:
        for folder, name in named_files(json.loads(Path(path).read_text(encoding="utf-8"))):
            os.makedirs(os.path.join(models_dir, folder), exist_ok=True)
            target = os.path.join(models_dir, folder, name)
            if os.path.exists(target):
                continue
            if name.endswith(".safetensors"):
                save_file({}, target)  # readable: the test nodes read every encoder's header
            else:
                open(target, "wb").close()
            print(f"{folder}/{name}: a stand-in with no weights (the frontend checks names only)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
