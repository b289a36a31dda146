"""Writes what test_comfyui_text_encoder_gguf.py loads: make_text_encoders.py's tiny encoders,
the tiny T5 again as GGUF files the way users have T5 encoders in GGUF, a LoRA for the tiny
CLIP-L and T5, and make_tiny_models.py's SD3 (LoraLoader needs a MODEL beside the CLIP).

- ``text_encoders/ferry-tiny-t5xxl-<mix>.gguf``: the same tensors as
  ``ferry-tiny-t5xxl.safetensors`` under llama.cpp's T5 names (``enc.blk.N.attn_q.weight``, ...;
  ComfyUI-GGUF's ``T5_SD_MAP`` maps them back to core's) and architecture ``t5encoder``, as
  llama.cpp's converter writes a T5 encoder. Mixes (make_gguf_models.py's rules): ``q8_0``
  (every 2-D weight of whole 32-value rows in Q8_0, the rest F32), ``k`` (rows of whole 256-value
  blocks in Q4_K/Q5_K, other 2-D weights Q8_0, 1-D F16), ``f16`` (every tensor F16). Their
  keys and logical shapes are the safetensors file's, so the test node pack's size hook
  (ferry_test_nodes.py) gives core the same tiny config for them.
- ``loras/ferry-tiny-te-lora.safetensors``: rank 4 on every CLIP-L layer's ``self_attn.q_proj``
  and ``mlp.fc1`` and every T5 block's ``SelfAttention.q`` and ``DenseReluDense.wo``, under
  core's generic text-encoder keys (``text_encoders.<encoder>.transformer.<name>``, which
  ``comfy.lora.model_lora_keys_clip`` maps on every core Ferry supports).

    python make_te_gguf_lora.py <comfyui checkout> <models dir>
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests/: gguf_standin's K-quant blocks

import make_text_encoders  # noqa: E402
import make_tiny_models  # noqa: E402

T5_FILE = "ferry-tiny-t5xxl.safetensors"
CLIP_L_FILE = "ferry-tiny-clip-l.safetensors"
MIXES = ("q8_0", "k", "f16")
LORA_FILE = "ferry-tiny-te-lora.safetensors"

#: Core's T5 names -> llama.cpp's, applied in this order (the reverse of ComfyUI-GGUF's
#: T5_SD_MAP, which maps a llama.cpp T5 back).
T5_TO_LLAMA_CPP = [
    ("layer.0.SelfAttention.relative_attention_bias", "attn_rel_b"),
    ("layer.0.SelfAttention.q", "attn_q"),
    ("layer.0.SelfAttention.k", "attn_k"),
    ("layer.0.SelfAttention.v", "attn_v"),
    ("layer.0.SelfAttention.o", "attn_o"),
    ("layer.0.layer_norm", "attn_norm"),
    ("layer.1.DenseReluDense.wi_0", "ffn_gate"),
    ("layer.1.DenseReluDense.wi_1", "ffn_up"),
    ("layer.1.DenseReluDense.wo", "ffn_down"),
    ("layer.1.layer_norm", "ffn_norm"),
    ("final_layer_norm", "output_norm"),
    ("shared", "token_embd"),
    (".block.", ".blk."),
    ("encoder.", "enc."),
]


def llama_cpp_name(name: str) -> str:
    for core, cpp in T5_TO_LLAMA_CPP:
        name = name.replace(core, cpp)
    return name


def write_t5_gguf(path: Path, sd: dict, mix: str) -> None:
    import gguf
    import numpy as np
    from make_gguf_models import _kinds

    writer = gguf.GGUFWriter(str(path), arch="t5encoder")
    for name, t in sd.items():
        if mix == "f16":
            qtype, arr = gguf.GGMLQuantizationType.F16, t.float().numpy().astype(np.float16)
        else:
            qtype, arr, _ = _kinds(name, t, mix, gguf)
        writer.add_tensor(llama_cpp_name(name), arr, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_lora(path: Path, encoders: dict[str, dict], rank: int = 4) -> None:
    import torch
    from safetensors.torch import save_file

    targets = (".self_attn.q_proj.weight", ".mlp.fc1.weight", ".SelfAttention.q.weight")
    targets += (".DenseReluDense.wo.weight",)
    g = torch.Generator().manual_seed(29)
    out = {}
    for encoder, sd in encoders.items():
        for name, t in sd.items():
            if name.endswith(targets):
                key = f"text_encoders.{encoder}.transformer.{name[: -len('.weight')]}"
                out[f"{key}.lora_up.weight"] = torch.randn(t.shape[0], rank, generator=g) * 0.2
                out[f"{key}.lora_down.weight"] = torch.randn(rank, t.shape[1], generator=g) * 0.2
                out[f"{key}.alpha"] = torch.tensor(float(rank))
    save_file(out, str(path))
    print(f"{path.name}: {len(out) // 3} LoRA pairs")


def main(comfy_dir: str, models_dir: str) -> None:
    from safetensors.torch import load_file

    make_text_encoders.main(comfy_dir, models_dir)
    make_tiny_models.main(comfy_dir, models_dir)
    te = Path(models_dir) / "text_encoders"
    t5 = load_file(str(te / T5_FILE))
    for mix in MIXES:
        write_t5_gguf(te / f"ferry-tiny-t5xxl-{mix}.gguf", t5, mix)
        print(f"ferry-tiny-t5xxl-{mix}.gguf: {len(t5)} tensors")
    loras = Path(models_dir) / "loras"
    loras.mkdir(parents=True, exist_ok=True)
    write_lora(loras / LORA_FILE, {"t5xxl": t5, "clip_l": load_file(str(te / CLIP_L_FILE))})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
