"""Tiny random networks for the ControlNet / model patch / CLIP vision suite
(test_comfyui_controlnet.py), each built by core's own classes and saved to a safetensors file:

- a Flux-shaped ControlNet (core's ControlNetFlux, XLabs' layout) that core's ControlNetLoader
  detects, beside the arch sweep's tiny Flux (make_arch_models.py, UNETLoader);
- an SDXL-shaped ControlNet (core's cldm ControlNet: label embedding, linear transformers)
  that ControlNetLoader detects, and the tiny SDXL-shaped UNet it steers (core's SDXL model
  config and class; core's detection fixes SDXL at 320 channels, so the test loader
  FerryTestTinyModel builds it from the config in the file's metadata);
- Qwen-Image's block-wise ControlNet (core's QwenImageBlockWiseControlNet, the model patch
  ModelPatchLoader builds at 60 x 3072 wide) at 2 x 128, and the tiny Qwen-Image UNet it
  patches (core's QwenImage config and class, 128 wide), both for the test loaders;
- a CLIP vision encoder of clip_vision_h's shape (core's ClipVisionModel from a tiny config of
  the same keys: 32 wide, 3 layers) for the test loader FerryTestTinyClipVision.

    python make_control_models.py <comfyui checkout> <models dir>

Writes ``<models dir>/control-models.json``: per network its file, or why this core has none.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

SDXL_UNET = {
    "use_checkpoint": False, "image_size": 32, "use_spatial_transformer": True,
    "legacy": False, "num_classes": "sequential", "adm_in_channels": 2816, "in_channels": 4,
    "out_channels": 4, "model_channels": 64, "num_res_blocks": [1, 1],
    "transformer_depth": [0, 1], "transformer_depth_output": [0, 0, 1, 1],
    "channel_mult": [1, 2], "transformer_depth_middle": 1, "use_linear_in_transformer": True,
    "context_dim": 32, "use_temporal_resblock": False, "use_temporal_attention": False,
}  # fmt: skip
QWEN_UNET = {
    "image_model": "qwen_image", "in_channels": 64, "out_channels": 16, "num_layers": 2,
    "attention_head_dim": 128, "num_attention_heads": 1, "joint_attention_dim": 32,
}  # fmt: skip
QWEN_PATCH = {"num_layers": 2, "dim": 128}
CLIP_VISION_H = {
    "attention_dropout": 0.0, "dropout": 0.0, "hidden_act": "gelu", "hidden_size": 32,
    "image_size": 28, "initializer_factor": 1.0, "initializer_range": 0.02,
    "intermediate_size": 64, "layer_norm_eps": 1e-05, "model_type": "clip_vision_model",
    "num_attention_heads": 2, "num_channels": 3, "num_hidden_layers": 3, "patch_size": 14,
    "projection_dim": 16, "torch_dtype": "float32",
}  # fmt: skip


def main(comfy_dir: str, models_dir: str) -> None:
    sys.path.insert(0, comfy_dir)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import comfy.cli_args

    comfy.cli_args.args.cpu = True  # before comfy.model_management is imported: no CUDA probe
    out: dict[str, Any] = {}
    for name, build in (("flux_cn", flux_controlnet), ("sdxl_cn", sdxl_controlnet),
                        ("qwen_patch", qwen_patch), ("clip_vision", clip_vision)):  # fmt: skip
        try:
            out[name] = build(models_dir)
        except Exception as e:  # reported per network: the suite skips it, saying why
            first = " ".join(str(e).split())[:300]  # a state-dict error lists every key
            out[name] = {"skip": f"not built in this core: {type(e).__name__}: {first}"}
        print(name, out[name], flush=True)
    with open(os.path.join(models_dir, "control-models.json"), "w") as f:
        json.dump(out, f, indent=1)


def _randomized(net: Any) -> dict[str, Any]:
    """``net``'s state dict with seeded random parameters (make_arch_models' rule)."""
    from make_arch_models import _random

    params = dict(net.named_parameters())
    return {
        k: (_random(k, tuple(v.shape)) if k in params else v).detach().contiguous()
        for k, v in net.state_dict().items()
    }


def _save(sd: dict[str, Any], models_dir: str, folder: str, file: str, **meta: Any) -> str:
    from safetensors.torch import save_file

    os.makedirs(os.path.join(models_dir, folder), exist_ok=True)
    save_file(
        sd, os.path.join(models_dir, folder, file), {k: json.dumps(v) for k, v in meta.items()}
    )
    return file


def _file_key(k: str) -> str:
    """A key as Flux checkpoints write it: newer cores name the QK norms' weight ``weight``
    and convert a file's ``scale`` as they load it (process_unet_state_dict)."""
    return re.sub(r"(query_norm|key_norm)\.weight$", r"\1.scale", k)


def _same_network(built: dict[str, Any], loaded: Any) -> None:
    """Core's loader read the file back as exactly the network built."""
    import torch

    got = {_file_key(k): v for k, v in loaded.state_dict().items()}
    assert sorted(got) == sorted(built), sorted(set(got) ^ set(built))[:5]
    for k, v in built.items():
        assert got[k].shape == v.shape and torch.equal(got[k].float(), v.float()), k


def flux_controlnet(models_dir: str) -> dict[str, Any]:
    import comfy.controlnet
    import comfy.ops
    import torch
    from comfy.ldm.flux.controlnet import ControlNetFlux
    from make_arch_models import _FLUX

    cfg = {**_FLUX, "depth_single_blocks": 0}  # XLabs' ControlNets: double blocks only
    ops = comfy.ops.disable_weight_init  # core's layers (its norms' "scale"), all randomized
    while True:  # the spec is the newest core's: a key an older core's Flux lacks is dropped
        try:
            net = ControlNetFlux(operations=ops, dtype=torch.float32, device="cpu", **cfg)
            break
        except TypeError as e:
            unknown = re.search(r"unexpected keyword argument '(\w+)'", str(e))
            if unknown is None or unknown.group(1) not in cfg:
                raise
            del cfg[unknown.group(1)]
    sd = {_file_key(k): v for k, v in _randomized(net).items()}
    loaded = comfy.controlnet.load_controlnet_state_dict(dict(sd))
    assert type(loaded.control_model).__name__ == "ControlNetFlux", type(loaded.control_model)
    _same_network(sd, loaded.control_model)
    return {"file": _save(sd, models_dir, "controlnet", "ferry-tiny-flux-cn.safetensors")}


def sdxl_controlnet(models_dir: str) -> dict[str, Any]:
    import comfy.controlnet
    import comfy.ops
    import comfy.supported_models
    import torch
    from comfy.cldm.cldm import ControlNet

    config = comfy.supported_models.SDXL(SDXL_UNET)
    config.set_inference_dtype(torch.float32, None)
    unet = _randomized(config.get_model({}, "").diffusion_model)
    base = _save(unet, models_dir, "diffusion_models", "ferry-tiny-sdxl.safetensors",
                 config="SDXL", unet=SDXL_UNET)  # fmt: skip
    cfg = {k: v for k, v in config.unet_config.items() if k not in ("dtype", "device")}
    net = ControlNet(hint_channels=3, dtype=torch.float32, device="cpu",
                     operations=comfy.ops.disable_weight_init, **cfg)  # fmt: skip
    sd = _randomized(net)
    loaded = comfy.controlnet.load_controlnet_state_dict(dict(sd))
    _same_network(sd, loaded.control_model)
    cn = _save(sd, models_dir, "controlnet", "ferry-tiny-sdxl-cn.safetensors")
    return {"file": cn, "base": base}


def qwen_patch(models_dir: str) -> dict[str, Any]:
    import comfy.ops
    import comfy.supported_models
    import torch
    from comfy_extras.nodes_model_patch import QwenImageBlockWiseControlNet

    config = comfy.supported_models.QwenImage(QWEN_UNET)
    config.set_inference_dtype(torch.float32, None)
    unet = _randomized(config.get_model({}, "").diffusion_model)
    base = _save(unet, models_dir, "diffusion_models", "ferry-tiny-qwen-image.safetensors",
                 config="QwenImage", unet=QWEN_UNET)  # fmt: skip
    net = QwenImageBlockWiseControlNet(dtype=torch.float32, operations=comfy.ops.manual_cast,
                                       **QWEN_PATCH)  # fmt: skip
    file = _save(_randomized(net), models_dir, "model_patches", "ferry-tiny-qwen-patch.safetensors",
                 patch=QWEN_PATCH)  # fmt: skip
    return {"file": file, "base": base}


def clip_vision(models_dir: str) -> dict[str, Any]:
    import tempfile

    import comfy.clip_vision

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(CLIP_VISION_H, f)
    try:
        model = comfy.clip_vision.ClipVisionModel(f.name)
    finally:
        os.unlink(f.name)
    sd = _randomized(model.model)
    file = _save(sd, models_dir, "clip_vision", "ferry-tiny-clip-vision-h.safetensors",
                 config=CLIP_VISION_H)  # fmt: skip
    return {"file": file}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
