"""Writes tiny models in ComfyUI's own quantized formats, built with core's classes (issue 40):

- ``ferry-q-wan-fp8scaled.safetensors``: a Wan 2.1 T2V (make_arch_models.py's tiny one) as
  Comfy-Org's ``*_fp8_scaled`` files are: every Linear in float8_e4m3fn with its
  ``<layer>.scale_weight`` and the ``scaled_fp8`` marker;
- ``ferry-q-wan-mixed.safetensors``: the same Wan as the ``fp8mixed`` files: some Linears fp8
  with ``<layer>.weight_scale`` and a ``<layer>.comfy_quant`` config, the others bf16;
- ``ferry-q-wan-mxfp8.safetensors`` (a core whose quant_ops has MXFP8, v0.33): the blocks'
  Linears in MXFP8 (core's own ``TensorCoreMXFP8Layout.quantize``: fp8 data and e8m0 block
  scales), configs in the header's ``_quantization_metadata``;
- ``ferry-q-t5-fp8scaled.safetensors``: the tiny T5-XXL of make_text_encoders.py (run it
  first) as ``umt5_xxl_fp8_e4m3fn_scaled``: its blocks' Linears fp8 with ``scale_weight`` and
  the ``scaled_fp8`` marker, the file's sizes kept in its metadata.

``--big N``: ``ferry-q-wan-big-{high,low}.safetensors`` (two fp8_scaled experts of about N MB
each, Wan 2.2's pair), ``ferry-q-t5-big-fp8scaled.safetensors`` (the big T5 of
make_text_encoders.py --big, fp8_scaled) and ``ferry-big-clip-l.safetensors`` (a CLIP-L of
about 950 MB in float16, the smaller file of a big dual load).

    python make_quant_models.py <comfyui checkout> <models dir> [--big N]
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

FP8_MAX = 448.0
HERE = os.path.dirname(os.path.abspath(__file__))


def _fp8(w: Any) -> tuple[Any, Any]:
    import torch

    scale = (w.float().abs().max() / FP8_MAX).clamp(min=1e-12)
    return (w.float() / scale).to(torch.float8_e4m3fn), scale.reshape(())


def _linears(sd: dict[str, Any], under: str) -> list[str]:
    return sorted(k for k, v in sd.items() if k.startswith(under) and k.endswith(".weight")
                  and v.dim() == 2)  # fmt: skip


def fp8_scaled(sd: dict[str, Any], under: str) -> dict[str, Any]:
    import torch

    out = dict(sd)
    for k in _linears(sd, under):
        out[k], out[k[: -len("weight")] + "scale_weight"] = _fp8(sd[k])
    out["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return out


def mixed(sd: dict[str, Any], under: str) -> dict[str, Any]:
    """Every other Linear of the blocks in fp8 (comfy_quant), the rest as they are (bf16)."""
    import torch

    out = dict(sd)
    conf = list(json.dumps({"format": "float8_e4m3fn"}).encode())
    for i, k in enumerate(_linears(sd, under)):
        if i % 2:
            continue
        layer = k[: -len(".weight")]
        out[k], out[layer + ".weight_scale"] = _fp8(sd[k])
        out[layer + ".comfy_quant"] = torch.tensor(conf, dtype=torch.uint8)
    return out


def mxfp8(sd: dict[str, Any], under: str) -> tuple[dict[str, Any], dict[str, str]] | None:
    try:
        import comfy.quant_ops as q
    except ImportError:  # v0.3.64: no comfy_quant at all
        return None
    layout = getattr(q, "TensorCoreMXFP8Layout", None)
    if layout is None or "mxfp8" not in q.QUANT_ALGOS:
        return None
    out, layers = dict(sd), {}
    for k in _linears(sd, under):
        layer = k[: -len(".weight")]
        qdata, params = layout.quantize(sd[k].float().contiguous())
        out[k] = qdata
        out[layer + ".weight_scale"] = params.scale.contiguous()
        layers[layer] = {"format": "mxfp8"}
    return out, {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})}


def write_lora(path: str, sd: dict[str, Any], rank: int = 4) -> None:
    """A LoRA on every Linear of the first two blocks (quantized ones and, in the mixed file,
    bf16 ones), in ComfyUI's "diffusion_model." key form."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(13)
    out = {}
    for k in _linears(sd, "blocks.0.") + _linears(sd, "blocks.1."):
        t, key = sd[k], "diffusion_model." + k[: -len(".weight")]
        out[f"{key}.lora_up.weight"] = torch.randn(t.shape[0], rank, generator=g) * 0.05
        out[f"{key}.lora_down.weight"] = torch.randn(rank, t.shape[1], generator=g) * 0.05
        out[f"{key}.alpha"] = torch.tensor(float(rank))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file(out, path)


def wan_state_dict(comfy_dir: str, width: int = 128, layers: int = 2) -> dict[str, Any]:
    import comfy.model_detection
    import make_arch_models as arch

    unet = {**arch._WAN, "dim": width, "ffn_dim": 2 * width, "num_heads": width // 128,
            "num_layers": layers}  # fmt: skip
    config = comfy.model_detection.model_config_from_unet_config(unet)
    return arch._random_state_dict(config)


def main(comfy_dir: str, models_dir: str, big_mb: int = 0) -> None:
    sys.path.insert(0, comfy_dir)
    sys.path.insert(0, HERE)
    import comfy.cli_args

    comfy.cli_args.args.cpu = True
    import torch
    from safetensors.torch import load_file, save_file

    dm = os.path.join(models_dir, "diffusion_models")
    os.makedirs(dm, exist_ok=True)
    sd = {k: v.contiguous() for k, v in wan_state_dict(comfy_dir).items()}
    save_file(sd, os.path.join(dm, "ferry-q-wan.safetensors"))
    # Every Linear (v0.3.64's scaled-fp8 ops give one the file leaves unscaled a scale of 1
    # that only the constructor knows: such a file is loaded whole there).
    save_file(fp8_scaled(sd, ""), os.path.join(dm, "ferry-q-wan-fp8scaled.safetensors"))
    save_file(mixed(sd, "blocks."), os.path.join(dm, "ferry-q-wan-mixed.safetensors"))
    mx = mxfp8(sd, "blocks.")
    if mx is not None:
        save_file(mx[0], os.path.join(dm, "ferry-q-wan-mxfp8.safetensors"), metadata=mx[1])
    print("wan:", sum(v.numel() for v in sd.values()), "values; mxfp8:", mx is not None)
    write_lora(os.path.join(models_dir, "loras", "ferry-q-wan-lora.safetensors"), sd)

    te = os.path.join(models_dir, "text_encoders")
    pairs = [("ferry-tiny-t5xxl.safetensors", "ferry-q-t5-fp8scaled.safetensors")]
    if big_mb:
        pairs.append(("ferry-big-t5xxl.safetensors", "ferry-q-t5-big-fp8scaled.safetensors"))
    for src, dst in pairs:
        path = os.path.join(te, src)
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
        t5 = load_file(path)
        save_file(fp8_scaled(t5, "encoder.block."), os.path.join(te, dst), metadata=meta)
        del t5
        print(dst, os.path.getsize(os.path.join(te, dst)))

    if big_mb:  # Wan 2.2's pair: two experts of about big_mb MB each in fp8, width 1024
        width = 1024
        per_layer = 12 * width * width  # q k v o, cross q k v o, ffn in + out (2x): fp8 bytes
        layers = max(2, big_mb * 2**20 // per_layer)
        for seed, name in ((11, "high"), (12, "low")):
            torch.manual_seed(seed)
            big = wan_state_dict(comfy_dir, width, layers)
            big = {k: v.contiguous() for k, v in fp8_scaled(big, "").items()}
            path = os.path.join(dm, f"ferry-q-wan-big-{name}.safetensors")
            save_file(big, path)
            del big
            print(path, os.path.getsize(path), flush=True)
        big_clip_l(te)


#: A CLIP-L of about 950 MB in float16 (core detects CLIP_L below 23 layers): the smaller
#: file of the big dual load (CLIP-L + the big T5, DualCLIPLoader type flux), bigger than the
#: dual limit's headroom.
BIG_CLIP_L = {
    "hidden_size": 1280, "intermediate_size": 5120, "num_attention_heads": 20,
    "num_hidden_layers": 21, "projection_dim": 1280,
}  # fmt: skip
BIG_CLIP_L_FILE = "ferry-big-clip-l.safetensors"


def big_clip_l(te_dir: str) -> None:
    import comfy.sd1_clip
    import make_text_encoders as mte
    import torch
    from safetensors.torch import save_file

    options = {"model_name": "clip_l", "clip_l_model_config": dict(BIG_CLIP_L)}
    te = comfy.sd1_clip.SDClipModel(device="meta", dtype=torch.float32, model_options=options)
    g = torch.Generator().manual_seed(5)
    sd = {}
    for k, v in te.transformer.state_dict().items():
        if v.is_floating_point():
            sd[k] = (torch.randn(v.shape, generator=g) * 0.02).to(torch.float16)
        else:  # position ids
            sd[k] = torch.arange(v.shape[-1]).expand(v.shape).contiguous().to(v.dtype)
    meta = {mte.META_KEY: json.dumps({"model_config": BIG_CLIP_L})}
    save_file(sd, os.path.join(te_dir, BIG_CLIP_L_FILE), metadata=meta)
    print(BIG_CLIP_L_FILE, os.path.getsize(os.path.join(te_dir, BIG_CLIP_L_FILE)), flush=True)


if __name__ == "__main__":
    flags = sys.argv[3:]
    big = int(flags[flags.index("--big") + 1]) if "--big" in flags else 0
    main(sys.argv[1], sys.argv[2], big)
