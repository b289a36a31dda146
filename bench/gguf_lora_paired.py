"""LoRA on GGUF weights through Ferry: baked once (``bake_lora on``) against ComfyUI-GGUF's
per-forward patches (``bake_lora off``) against no LoRA, taken in pairs (one process, the
forwards alternating, as bench/paired.py does), for Q8_0 and Q4_K.

The layers are ComfyUI-GGUF's own (``GGMLOps.Linear`` from its ops.py, its torch dequant
kernels), the LoRAs core's own (``comfy.weight_adapter.LoRAAdapter``, ``comfy.lora.
calculate_weight``), hung on the weights as ``GGUFModelPatcher.patch_weight_to_device`` hangs
them; baking runs Ferry's ComfyUI code (nodes/bake_lora.py). Every output is compared with
ComfyUI-GGUF's per-forward result without Ferry (``torch.equal``). Run with a ComfyUI
checkout's Python (it needs ``comfy`` and the ``gguf`` package):

    FERRY_COMFYUI=/work/comfy/v0.33.0 FERRY_COMFYUI_GGUF=/work/comfy/ComfyUI-GGUF \\
    PYTHONPATH=tests/comfyui/site /work/comfy/v0.33.0/venv/bin/python -m bench.gguf_lora_paired

CPU: the Ferry rows run the RAM tier on the CPU (each group copied into its slot).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
PACK = "ComfyUI-Ferry"


def import_hosts() -> tuple[Any, Any, Any]:
    """ComfyUI core (on CPU), ComfyUI-GGUF's ops (without its node file), and this pack."""
    comfy_dir = os.environ.get("FERRY_COMFYUI")
    gguf_dir = os.environ.get("FERRY_COMFYUI_GGUF")
    if not comfy_dir or not gguf_dir:
        raise SystemExit("set FERRY_COMFYUI and FERRY_COMFYUI_GGUF (see the docstring)")
    sys.path.insert(0, comfy_dir)
    import comfy.cli_args

    comfy.cli_args.args.cpu = True
    import comfy.model_management  # noqa: F401  (with --cpu set first)

    pkg = types.ModuleType("comfyui_gguf")  # ops.py and dequant.py only: no nodes.py
    pkg.__path__ = [gguf_dir]
    sys.modules["comfyui_gguf"] = pkg
    ops = importlib.import_module("comfyui_gguf.ops")
    if PACK not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            PACK, REPO / "__init__.py", submodule_search_locations=[str(REPO)]
        )
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[PACK] = mod
        spec.loader.exec_module(mod)
    ferry = importlib.import_module(f"{PACK}.offload_core")
    bake = importlib.import_module(f"{PACK}.nodes.bake_lora")
    return ops, ferry, bake


class Block(nn.Module):
    """A transformer block's Linears (qkv, proj, MLP up and down) around a residual."""

    def __init__(self, layers: dict[str, nn.Module]) -> None:
        super().__init__()
        for k, v in layers.items():
            setattr(self, k, v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.qkv(x)[..., : x.shape[-1]]
        x = x + self.proj(nn.functional.gelu(h))
        return x + self.down(nn.functional.gelu(self.up(x)))


class Net(nn.Module):
    def __init__(self, blocks: list[Block]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


class Holder(nn.Module):
    """What a ModelPatcher's ``model`` is to bake_lora: the network and its dtype."""

    def __init__(self, net: Net) -> None:
        super().__init__()
        self.diffusion_model = net
        self.manual_cast_dtype = None

    def get_dtype(self) -> torch.dtype:
        return torch.float32


def shapes(width: int) -> dict[str, tuple[int, int]]:
    return {
        "qkv": (3 * width, width),
        "proj": (width, width),
        "up": (4 * width, width),
        "down": (width, 4 * width),
    }


def raw_weights(quant: str, width: int, depth: int, seed: int) -> dict[str, Any]:
    """Each Linear's raw GGUF bytes (Q8_0 quantized by the ``gguf`` package; Q4_K random
    blocks with small scales: the package has no K-quant encoder) and an F32 bias."""
    import gguf

    sys.path.insert(0, str(REPO))
    from tests.gguf_standin import k_quant_bytes

    rng = np.random.default_rng(seed)
    T = gguf.GGMLQuantizationType
    out = {}
    for i in range(depth):
        for name, (o, n) in shapes(width).items():
            if quant == "q8_0":
                w = (rng.standard_normal((o, n)) * 0.02).astype(np.float32)
                out[f"blocks.{i}.{name}"] = (T.Q8_0, gguf.quants.quantize(w, T.Q8_0), (o, n))
            else:
                out[f"blocks.{i}.{name}"] = (T.Q4_K, k_quant_bytes(o, n, T.Q4_K, rng), (o, n))
            bias = (rng.standard_normal(o) * 0.01).astype(np.float32)
            out[f"blocks.{i}.{name}.bias"] = (T.F32, bias, (o,))
    return out


def build(ops: Any, raw: dict[str, Any], width: int, depth: int) -> Holder:
    """A fresh network of ComfyUI-GGUF Linears over copies of ``raw`` (as its loader wraps
    each tensor: GGMLTensor, the dequantized shape as ``tensor_shape``)."""

    def wrap(entry: Any) -> nn.Parameter:
        qtype, arr, shape = entry
        t = ops.GGMLTensor(
            torch.from_numpy(np.array(arr)), tensor_type=qtype, tensor_shape=torch.Size(shape)
        )
        return nn.Parameter(t, requires_grad=False)

    blocks = []
    for i in range(depth):
        layers = {}
        for name, (o, n) in shapes(width).items():
            lin = ops.GGMLOps.Linear(n, o)
            lin.weight = wrap(raw[f"blocks.{i}.{name}"])
            lin.bias = wrap(raw[f"blocks.{i}.{name}.bias"])
            layers[name] = lin
        blocks.append(Block(layers))
    return Holder(Net(blocks))


def make_loras(count: int, width: int, depth: int, rank: int, seed: int) -> dict[str, list[Any]]:
    """``count`` LoRAs on every Linear, as core's patches for each key (add_patches' tuples:
    strength, adapter, strength_model, offset, function)."""
    from comfy.weight_adapter.lora import LoRAAdapter

    g = torch.Generator().manual_seed(seed)
    patches: dict[str, list[Any]] = {}
    for i in range(depth):
        for name, (o, n) in shapes(width).items():
            key = f"diffusion_model.blocks.{i}.{name}.weight"
            for k in range(count):
                up = torch.randn(o, rank, generator=g) * 0.01
                down = torch.randn(rank, n, generator=g) * 0.01
                adapter = LoRAAdapter(set(), (up, down, float(rank), None, None, None))
                patches.setdefault(key, []).append((0.8 + 0.1 * k, adapter, 1.0, None, None))
    return patches


def hang_patches(holder: Holder, patches: dict[str, list[Any]]) -> None:
    """What GGUFModelPatcher.patch_weight_to_device does to a quantized weight."""
    import comfy.utils

    for key, p in patches.items():
        w = comfy.utils.get_attr(holder, key)
        w.patches = [(p, key)]


class FakePatcher:
    """The ModelPatcher surface bake_lora reads."""

    def __init__(self, holder: Holder, patches: dict[str, list[Any]]) -> None:
        self.model = holder
        self.patches = patches
        self.backup: dict[str, Any] = {}
        self.offload_device = torch.device("cpu")


def run(quant: str, args: argparse.Namespace, echo: Any) -> list[tuple[str, float, float, str]]:
    ops, ferry, bake = import_hosts()
    width, depth = args.width, args.depth
    raw = raw_weights(quant, width, depth, seed=1)
    loras = make_loras(args.loras, width, depth, args.rank, seed=2)
    x = torch.randn(args.tokens, width, generator=torch.Generator().manual_seed(3))
    policy = {
        mode: ferry.OffloadPolicy(tier=ferry.RamTier(), prefetch_depth=2, bake_lora=mode)
        for mode in ("off", "on")
    }
    models: dict[str, Holder] = {}
    # References: ComfyUI-GGUF on its own, no Ferry.
    models["gguf-nolora"] = build(ops, raw, width, depth)
    models["gguf-lora"] = build(ops, raw, width, depth)
    hang_patches(models["gguf-lora"], loras)
    handles = []
    for name, lora, mode in (
        ("ferry-nolora", False, "off"),
        ("ferry-lora-perforward", True, "off"),
        ("ferry-lora-baked", True, "on"),
    ):
        h = build(ops, raw, width, depth)
        if lora:
            hang_patches(h, loras)
            t0 = time.perf_counter()
            choice = bake.bake_lora(FakePatcher(h, loras), torch.device("cpu"), policy[mode])
            if choice is not None:
                echo(f"  {name}: {choice.describe()} ({time.perf_counter() - t0:.2f} s)")
        handles.append(ferry.apply_offload(h.diffusion_model, policy[mode], onload_device="cpu"))
        models[name] = h
    # auto's choice on this machine, for the log (not timed: the same model as on or off).
    auto = build(ops, raw, width, depth)
    hang_patches(auto, loras)
    auto_policy = ferry.OffloadPolicy(tier=ferry.RamTier(), bake_lora="auto")
    choice = bake.bake_lora(FakePatcher(auto, loras), torch.device("cpu"), auto_policy)
    if choice is not None:
        echo(f"  auto: {choice.describe()}")
    del auto
    times: dict[str, list[float]] = {n: [] for n in models}
    refs = {}
    with torch.no_grad():
        refs["gguf-nolora"] = models["gguf-nolora"].diffusion_model(x)
        refs["gguf-lora"] = models["gguf-lora"].diffusion_model(x)
        want = {
            "gguf-nolora": "gguf-nolora",
            "gguf-lora": "gguf-lora",
            "ferry-nolora": "gguf-nolora",
            "ferry-lora-perforward": "gguf-lora",
            "ferry-lora-baked": "gguf-lora",
        }
        equal = {n: True for n in models}
        for n, m in models.items():  # warm-up (Ferry traces its order)
            equal[n] &= torch.equal(m.diffusion_model(x), refs[want[n]])
        for r in range(args.rounds):
            order = list(models) if r % 2 == 0 else list(reversed(models))
            for n in order:
                t0 = time.perf_counter()
                out = models[n].diffusion_model(x)
                times[n].append(time.perf_counter() - t0)
                equal[n] &= torch.equal(out, refs[want[n]])
    for h in handles:
        h.remove()
    base = statistics.median(times["ferry-nolora"])
    rows = []
    for n in models:
        med = statistics.median(times[n])
        rows.append((n, med, med / base, "yes" if equal[n] else "NO"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quants", default="q8_0,q4_k")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--loras", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.manual_seed(0)
    echo = print
    echo(
        f"GGUF + {args.loras} LoRAs (rank {args.rank}) through Ferry: {args.depth} blocks of "
        f"width {args.width}, {args.tokens} tokens, {args.rounds} rounds, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    lines = [
        "| quant | row | s/forward (median) | x ferry-nolora | equal to ComfyUI-GGUF |",
        "|---|---|---|---|---|",
    ]
    ok = True
    for quant in args.quants.split(","):
        echo(f"{quant}:")
        for n, med, ratio, eq in run(quant, args, echo):
            lines.append(f"| {quant} | {n} | {med:.3f} | {ratio:.2f} | {eq} |")
            ok &= eq == "yes"
    echo("\n".join(lines))
    if not ok:
        raise SystemExit("an output differs from ComfyUI-GGUF's")


if __name__ == "__main__":
    main()
