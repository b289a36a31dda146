"""Writes tiny text encoders with random weights, built by core's own classes and detected by
core's CLIPLoader / DualCLIPLoader as the real ones are:

- ``ferry-tiny-t5xxl.safetensors``: T5-XXL-shaped (core's ``sd3_clip.T5XXLModel``): 24 blocks and
  the 10240-wide gated feed-forward detection looks for, 32 wide elsewhere (CLIPLoader type sd3;
  with the CLIP-L one, DualCLIPLoader type flux);
- ``ferry-tiny-t5xxl-fp8.safetensors``: the same T5 in float8_e4m3fn, as the fp8 T5 files
  users load are (core builds it in fp8 and computes in its manual-cast dtype);
- ``ferry-tiny-clip-l.safetensors``: CLIP-L-shaped (core's ``sd1_clip.SDClipModel``), 4 layers;
- ``ferry-tiny-gemma2.safetensors``: an LLM, Gemma-2-shaped (core's ``lumina2.Gemma2_2BModel``,
  class ``llama.Gemma2_2B``), 4 decoder layers (CLIPLoader type lumina2). Its tokenizer is in
  the file (``spiece_model``), as Lumina 2's Gemma files carry it: a small SentencePiece model
  trained here, since the checkouts this runs on lack the tokenizers core ships for its
  Llama and Qwen encoders (``llama_tokenizer/tokenizer.json``, ``qwen25_tokenizer/vocab.json``).

Core builds every text encoder from a fixed config (a JSON file or a dataclass's defaults: a
T5-XXL is 4.7 B parameters) and changes it only through its own hook,
``model_options["<model_name>_model_config"]`` (``SDClipModel.__init__``), which CLIPLoader has no
input for. So each file carries the sizes it was built with in its safetensors metadata
(``ferry_test_model_config``), and the test node pack (ferry_test_nodes.py) hands them to core's
``load_clip`` in that hook. A CLIP-L's sizes go in ``model_options["model_config"]``: core's
long-CLIP detection (``long_clipl.model_options_long_clip``) rebuilds ``clip_l_model_config`` from
it. Detection, tokenizers (core ships them: T5, CLIP, Llama) and every layer are core's.

    python make_text_encoders.py <comfyui checkout> <models dir> [--big]

``--big`` also writes ``ferry-big-t5xxl.safetensors``: a T5-XXL-shaped encoder of about
1.7 GB in float16 (``--big-layers=36``: 36 blocks, about 2.5 GB, for the whole graph of
make_whole_graph.py) (the dtype v0.33 computes a T5 in on a CPU: streamed verbatim), bigger than
twice the cgroup limit of test_comfyui_text_encoder_cgroup.py. It is made tensor by tensor
from the network built on meta, so writing it needs the file's size in RAM, not twice it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

#: The sizes given to core's configs (the rest keep core's values).
#: T5-XXL: core finds one by its 24th block's gated feed-forward, 10240 wide (v0.8 on) or 4096
#: deep (before): the first of these that this core detects as T5_XXL is written.
T5XXL = [
    {"d_model": 32, "d_kv": 16, "num_heads": 2, "d_ff": 10240, "num_layers": 24},
    {"d_model": 4096, "d_kv": 16, "num_heads": 2, "d_ff": 32, "num_layers": 24},
]
#: The big one: the same detection rules, sizes for about 1.7 GB of float16.
BIG_T5XXL = [
    {"d_model": 1024, "d_kv": 64, "num_heads": 16, "d_ff": 10240, "num_layers": 24},
    {"d_model": 4096, "d_kv": 64, "num_heads": 16, "d_ff": 1024, "num_layers": 24},
]
BIG_T5XXL_FILE = "ferry-big-t5xxl.safetensors"
T5XXL_FP8_FILE = "ferry-tiny-t5xxl-fp8.safetensors"
CLIP_L = {
    "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
    "num_hidden_layers": 4, "projection_dim": 32,
}  # fmt: skip
GEMMA2 = {
    "vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 2, "num_key_value_heads": 1,
}  # fmt: skip
#: What the tokenizer learns from: Gemma's special ids (pad 0, eos 1, bos 2, unk 3) kept.
CORPUS = [
    "a ferry crossing a wide river at dawn, oil painting",
    "a lighthouse in fog, long exposure photograph",
    "You are an assistant designed to generate superior images with the superior degree of "
    "image-text alignment based on textual prompts or user prompts.",
    "a red fox in the snow, the quick brown fox jumps over the lazy dog",
    "mountains, rivers, boats, harbours, bridges and the sea at night under the stars",
] * 20
META_KEY = "ferry_test_model_config"


def _random(sd: dict, seed: int) -> dict:
    """Core's layers skip initialisation (their weights are whatever memory held): seeded
    values instead, small enough that 24 random blocks stay finite in float16."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in sd.items():
        if v.is_floating_point():
            out[k] = (torch.randn(v.shape, generator=g) * 0.05).to(torch.float16)
        else:
            out[k] = v.clone()
    return out


def _spiece_model() -> bytes:
    import io

    import sentencepiece

    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=out, vocab_size=200, model_type="bpe",
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, num_threads=1, minloglevel=2,
    )  # fmt: skip
    return out.getvalue()


def _detected_as(cls: Any, model_name: str, candidates: list[dict], want: str) -> dict:
    """The first sizes whose network (built on meta) core's ``detect_te_model`` takes for
    ``want``: the file is then loaded as the real one would be."""
    import comfy.sd
    import torch

    for sizes in candidates:
        options = {"model_name": model_name, f"{model_name}_model_config": dict(sizes)}
        te = cls(device="meta", dtype=torch.float16, model_options=options)
        got = comfy.sd.detect_te_model(te.transformer.state_dict())
        if got is not None and got.name == want:
            return sizes
    raise SystemExit(f"core detects none of {candidates} as {want}")


def _big_t5(cls: Any, out_dir: str, layers: int) -> None:
    """The big T5, float16, its values seeded per tensor (small: the blocks stay finite);
    ``layers`` blocks (24 or more: detection looks at the 24th)."""
    import torch
    from safetensors.torch import save_file

    sizes = {**_detected_as(cls, "t5xxl", BIG_T5XXL, "T5_XXL"), "num_layers": layers}
    options = {"model_name": "t5xxl", "t5xxl_model_config": dict(sizes)}
    te = cls(device="meta", dtype=torch.float32, model_options=options)
    g = torch.Generator().manual_seed(4)
    sd = {
        k: (torch.randn(v.shape, generator=g) * 0.02).to(torch.float16)
        for k, v in te.transformer.state_dict().items()
    }
    meta = {META_KEY: json.dumps({"t5xxl_model_config": sizes})}
    save_file(sd, os.path.join(out_dir, BIG_T5XXL_FILE), metadata=meta)
    print(f"{BIG_T5XXL_FILE}: {sum(v.numel() for v in sd.values())} values, {len(sd)} tensors")


def main(comfy_dir: str, models_dir: str, big: bool = False, big_layers: int = 24) -> None:
    sys.path.insert(0, comfy_dir)
    import comfy.cli_args
    import torch
    from safetensors.torch import save_file

    comfy.cli_args.args.cpu = True  # before comfy.model_management is imported: no CUDA probe
    import comfy.sd1_clip
    import comfy.text_encoders.lumina2
    import comfy.text_encoders.sd3_clip

    t5, clip_l = comfy.text_encoders.sd3_clip.T5XXLModel, comfy.sd1_clip.SDClipModel
    gemma2 = comfy.text_encoders.lumina2.Gemma2_2BModel
    builders = {
        "ferry-tiny-t5xxl.safetensors": ("t5xxl", T5XXL, "T5_XXL", t5, 1),
        "ferry-tiny-clip-l.safetensors": ("clip_l", [CLIP_L], "CLIP_L", clip_l, 2),
        "ferry-tiny-gemma2.safetensors": ("gemma2_2b", [GEMMA2], "GEMMA_2_2B", gemma2, 3),
    }
    out_dir = os.path.join(models_dir, "text_encoders")
    os.makedirs(out_dir, exist_ok=True)
    for name, (model_name, candidates, want, cls, seed) in builders.items():
        sizes = _detected_as(cls, model_name, candidates, want)
        options = {"model_name": model_name, f"{model_name}_model_config": dict(sizes)}
        te = cls(device="cpu", dtype=torch.float32, model_options=options)
        sd = _random(te.transformer.state_dict(), seed)
        if model_name == "gemma2_2b":
            sd["spiece_model"] = torch.frombuffer(bytearray(_spiece_model()), dtype=torch.uint8)
        hook = "model_config" if model_name == "clip_l" else f"{model_name}_model_config"
        meta = {META_KEY: json.dumps({hook: sizes})}
        save_file(sd, os.path.join(out_dir, name), metadata=meta)
        print(f"{name}: {sum(v.numel() for v in sd.values())} values, {len(sd)} tensors")
        if model_name == "t5xxl":  # as t5xxl_fp8_e4m3fn.safetensors: every weight in fp8
            fp8 = {
                k: v.to(torch.float8_e4m3fn) if v.is_floating_point() else v for k, v in sd.items()
            }
            save_file(fp8, os.path.join(out_dir, T5XXL_FP8_FILE), metadata=meta)
            print(f"{T5XXL_FP8_FILE}: the same values in float8_e4m3fn")
    if big:
        _big_t5(t5, out_dir, big_layers)


if __name__ == "__main__":
    flags = sys.argv[3:]
    layers = [int(f.split("=", 1)[1]) for f in flags if f.startswith("--big-layers=")]
    main(sys.argv[1], sys.argv[2], "--big" in flags, *layers)
