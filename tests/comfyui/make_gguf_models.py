"""Writes tiny Wan 2.1 and HunyuanVideo models as GGUF files, the way GGUF conversion tools
write them, and a LoRA for each.

Run with ComfyUI's Python (the networks are core's own classes, so the keys are what core's
model detection and ComfyUI-GGUF's loader expect; that venv has the ``gguf`` package):

    python make_gguf_models.py <comfyui checkout> <models dir>
    python make_gguf_models.py <comfyui checkout> <models dir> --big <layers>

``--big`` writes one Wan 2.1 model of ``layers`` 1024-wide blocks in Q8_0 instead
(``ferry-big-wan-q8_0.gguf``: 18 MB a block), built on the meta device and filled one tensor at
a time, for the memory-limit test: its weights are never whole in RAM as floats.

Each model in two files (``diffusion_models/ferry-tiny-<arch>-<mix>.gguf``):
- ``q8_0``: every 2-D weight whose rows are whole Q8_0 blocks (32 values) in Q8_0, the rest F32;
- ``k``: rows of whole K-quant blocks (256 values) in Q4_K, every second block's in Q5_K, other
  2-D weights in Q8_0 where they fit, small and non-2-D tensors F16 (biases, norms) or F32.
Tensors of more than 4 dimensions (the patch embeddings' 3-D convolutions), which GGUF cannot
hold, are written flattened to 2-D with their shape in ``comfy.gguf.orig_shape.<name>``, as
ComfyUI-GGUF's conversion tool does. The ``gguf`` package has no K-quant encoder (it decodes
only), so K-quant blocks are random quants under small, finite scales (bench/k_quant.py).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the checkout: bench/k_quant.py's K-quant blocks


def _wan(comfy_ops):
    from comfy.ldm.wan.model import WanModel

    # Detection (comfy/model_detection.py, "Wan 2.1"): dim from head.modulation, 1 head per
    # 128, ffn_dim from blocks.0.ffn.0, text_dim fixed at 4096.
    return WanModel(
        model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=128, ffn_dim=256, freq_dim=256,
        text_dim=4096, out_dim=16, num_heads=1, num_layers=3, operations=comfy_ops,
    )  # fmt: skip


def _big_wan(comfy_ops, layers: int):
    from comfy.ldm.wan.model import WanModel

    return WanModel(
        model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=1024, ffn_dim=4096, freq_dim=256,
        text_dim=4096, out_dim=16, num_heads=8, num_layers=layers, operations=comfy_ops,
        device="meta",
    )  # fmt: skip


def write_big(models_dir: str, layers: int) -> None:
    import comfy.ops
    import gguf
    import torch

    net = _big_wan(comfy.ops.disable_weight_init, layers)
    dm = Path(models_dir) / "diffusion_models"
    dm.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(dm / "ferry-big-wan-q8_0.gguf"), arch="wan")
    g = torch.Generator().manual_seed(0)
    shapes = {k: t.shape for k, t in net.state_dict().items()}  # meta: shapes only
    for i, (name, shape) in enumerate(shapes.items()):
        t = torch.randn(shape, generator=g) * (0.02 if len(shape) > 1 else 0.1)
        qtype, arr, orig = _kinds(name, t, "q8_0", gguf)  # quantized now: floats never pile up
        if orig is not None:
            writer.add_array(f"comfy.gguf.orig_shape.{name}", orig)
        writer.add_tensor(name, arr, raw_dtype=qtype)
        if i % 100 == 0:
            print(f"  {i}/{len(shapes)} tensors", flush=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote ferry-big-wan-q8_0.gguf ({layers} blocks)")


def _hunyuan(comfy_ops):
    from comfy.ldm.hunyuan_video.model import HunyuanVideo, HunyuanVideoParams

    # Detection ("Hunyuan Video"): hidden size from img_in, 1 head per 128, vector_in present
    # (vec_in_dim 768: without it the model is taken for HunyuanImage 2.1), context from txt_in.
    want = dict(
        in_channels=16, out_channels=16, vec_in_dim=768, context_in_dim=32, hidden_size=128,
        mlp_ratio=4.0, num_heads=1, depth=2, depth_single_blocks=2, axes_dim=[16, 56, 56],
        theta=256, patch_size=[1, 2, 2], qkv_bias=True, guidance_embed=False, byt5=False,
        meanflow=False, use_cond_type_embedding=False, vision_in_dim=None, meanflow_sum=False,
    )  # fmt: skip
    fields = {f.name for f in dataclasses.fields(HunyuanVideoParams)}
    return HunyuanVideo(operations=comfy_ops, **{k: v for k, v in want.items() if k in fields})


ARCHS = {"wan": ("wan", _wan), "hyvid": ("hyvid", _hunyuan)}


def _kinds(name: str, t, mix: str, gguf):
    """(GGML type, array to write, original shape or None) for one tensor."""
    import numpy as np

    T = gguf.GGMLQuantizationType
    arr = t.float().numpy()
    orig = None
    if arr.ndim > 4:  # 3-D convolutions: flattened, their shape kept aside
        orig = list(arr.shape)
        arr = arr.reshape(arr.shape[0], -1)
    width = arr.shape[-1]
    quantizable = t.dim() == 2 and arr.shape[0] > 1
    if mix == "k" and quantizable and width % 256 == 0:
        block = (
            int(name.split(".")[1]) if name.split(".")[1:2] and name.split(".")[1].isdigit() else 0
        )
        qtype = T.Q5_K if block % 2 else T.Q4_K
        from bench.k_quant import k_quant_bytes

        return (
            qtype,
            k_quant_bytes(arr.shape[0], width, qtype, np.random.default_rng(len(name))),
            orig,
        )
    if quantizable and width % 32 == 0:
        return T.Q8_0, gguf.quants.quantize(arr.astype(np.float32), T.Q8_0), orig
    if mix == "k" and arr.ndim == 1:
        return T.F16, arr.astype(np.float16), orig
    return T.F32, arr.astype(np.float32), orig


def write_gguf(path: Path, arch: str, sd, mix: str) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch=arch)
    for name, t in sd.items():
        qtype, arr, orig = _kinds(name, t, mix, gguf)
        if orig is not None:
            writer.add_array(f"comfy.gguf.orig_shape.{name}", orig)
        writer.add_tensor(name, arr, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_lora(path: Path, sd, rank: int = 4) -> None:
    """A LoRA on every block's first two 2-D Linear weights, in ComfyUI's "diffusion_model."
    key form (core maps it for every model: comfy/lora.py model_lora_keys_unet)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(11)
    out = {}
    for name, t in sd.items():
        if t.dim() == 2 and ".0." in name and name.endswith(".weight") and t.shape[0] > 1:
            key = "diffusion_model." + name[: -len(".weight")]
            out[f"{key}.lora_up.weight"] = torch.randn(t.shape[0], rank, generator=g) * 0.05
            out[f"{key}.lora_down.weight"] = torch.randn(rank, t.shape[1], generator=g) * 0.05
            out[f"{key}.alpha"] = torch.tensor(float(rank))
    save_file(out, str(path))


def main(comfy_dir: str, models_dir: str, big_layers: int = 0) -> None:
    sys.path.insert(0, comfy_dir)
    os.chdir(comfy_dir)
    import comfy.cli_args
    import torch

    comfy.cli_args.args.cpu = True  # before comfy.model_management: no CUDA probe
    import comfy.ops

    if big_layers:
        write_big(models_dir, big_layers)
        return

    dm = Path(models_dir) / "diffusion_models"
    loras = Path(models_dir) / "loras"
    dm.mkdir(parents=True, exist_ok=True)
    loras.mkdir(parents=True, exist_ok=True)
    for name, (arch, build) in ARCHS.items():
        torch.manual_seed(0)
        net = build(comfy.ops.disable_weight_init)
        with torch.no_grad():  # core's classes leave weights uninitialised: give them values
            for p in net.parameters():
                p.copy_(torch.randn(p.shape) * (0.02 if p.dim() > 1 else 0.1))
        sd = {k: v.detach().contiguous() for k, v in net.state_dict().items()}
        for mix in ("q8_0", "k"):
            write_gguf(dm / f"ferry-tiny-{name}-{mix}.gguf", arch, sd, mix)
        write_lora(loras / f"ferry-tiny-{name}-lora.safetensors", sd)
        print(
            f"wrote ferry-tiny-{name}-{{q8_0,k}}.gguf ({sum(t.numel() for t in sd.values())} values)"
        )


if __name__ == "__main__":
    big = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--big" else 0
    main(sys.argv[1], sys.argv[2], big)
