"""LoRA on GGUF weights through Ferry: baked once (``bake_lora on``) against ComfyUI-GGUF's
per-forward patches (``bake_lora off``) against no LoRA, taken in pairs (one process, the
forwards alternating, as bench/paired.py does), for Q8_0 and Q4_K.

The layers are ComfyUI-GGUF's own (``GGMLOps.Linear`` from its ops.py, its torch dequant
kernels), the LoRAs core's own (``comfy.weight_adapter.LoRAAdapter``, ``comfy.lora.
calculate_weight``), hung on the weights as ``GGUFModelPatcher.patch_weight_to_device`` hangs
them; baking runs Ferry's ComfyUI code (nodes/patcher/bake_lora.py). Every output is compared with
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


def import_hosts(device: str = "cpu") -> tuple[Any, Any, Any]:
    """ComfyUI core (``--cpu`` on a CPU), ComfyUI-GGUF's ops (without its node file), and
    this pack."""
    comfy_dir = os.environ.get("FERRY_COMFYUI")
    gguf_dir = os.environ.get("FERRY_COMFYUI_GGUF")
    if not comfy_dir or not gguf_dir:
        raise SystemExit("set FERRY_COMFYUI and FERRY_COMFYUI_GGUF (see the docstring)")
    sys.path.insert(0, comfy_dir)
    import comfy.cli_args

    comfy.cli_args.args.cpu = torch.device(device).type == "cpu"
    import comfy.model_management

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
    bake = importlib.import_module(f"{PACK}.nodes.patcher.bake_lora")
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
        self.dtype = torch.float32  # what its layers get their input in

    def get_dtype(self) -> torch.dtype:
        return self.dtype


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

    from bench.k_quant import k_quant_bytes

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
    ops, ferry, bake = import_hosts(args.device)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    width, depth = args.width, args.depth
    raw = raw_weights(quant, width, depth, seed=1)
    counts = sorted({int(n) for n in str(args.loras).split(",") if int(n) > 0})
    loras = {n: make_loras(n, width, depth, args.rank, seed=2) for n in counts}
    x = torch.randn(args.tokens, width, generator=torch.Generator().manual_seed(3))
    x = x.to(device, dtype)
    policy = {
        mode: ferry.OffloadPolicy(tier=ferry.RamTier(), prefetch_depth=2, bake_lora=mode)
        for mode in ("off", "on", "auto")
    }

    def fresh(n: int) -> Holder:
        h = build(ops, raw, width, depth)
        h.dtype = dtype
        if n:
            hang_patches(h, loras[n])
        return h

    models: dict[str, Holder] = {}
    want: dict[str, str] = {}
    # References: ComfyUI-GGUF on its own, no Ferry, on the device.
    for n in (0, *counts):
        models[f"gguf-{n}lora"] = fresh(n).to(device)
        want[f"gguf-{n}lora"] = f"gguf-{n}lora"
    handles = []
    rows_ferry = [("ferry-0lora", 0, "off")]
    for n in counts:
        rows_ferry += [(f"ferry-{n}lora-perforward", n, "off"), (f"ferry-{n}lora-baked", n, "on")]
    for name, n, mode in rows_ferry:
        h = fresh(n)
        if n:
            t0 = time.perf_counter()
            choice = bake.bake_lora(FakePatcher(h, loras[n]), device, policy[mode])
            if choice is not None:
                echo(f"  {name}: {choice.describe()} ({time.perf_counter() - t0:.2f} s)")
        handles.append(ferry.apply_offload(h.diffusion_model, policy[mode], onload_device=device))
        models[name] = h
        want[name] = f"gguf-{n}lora"
    for n in counts:  # auto's choice here, for the log (not timed: it is on's or off's model)
        choice = bake.bake_lora(FakePatcher(fresh(n), loras[n]), device, policy["auto"])
        if choice is not None:
            echo(f"  {n} LoRA(s), auto: {choice.describe()}")
    times: dict[str, list[float]] = {n: [] for n in models}
    with torch.no_grad():
        refs = {n: models[n].diffusion_model(x) for n in models if n.startswith("gguf-")}
        equal = {n: True for n in models}
        for n, m in models.items():  # warm-up (Ferry traces its order)
            equal[n] &= torch.equal(m.diffusion_model(x), refs[want[n]])
        for r in range(args.rounds):
            order = list(models) if r % 2 == 0 else list(reversed(models))
            for n in order:
                _sync(device)
                t0 = time.perf_counter()
                out = models[n].diffusion_model(x)
                _sync(device)
                times[n].append(time.perf_counter() - t0)
                equal[n] &= torch.equal(out, refs[want[n]])
    for h in handles:
        h.remove()
    base = statistics.median(times["ferry-0lora"])
    rows = []
    for n in models:
        med = statistics.median(times[n])
        rows.append((n, med, med / base, "yes" if equal[n] else "NO"))
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quants", default="q8_0,q4_k")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--loras", default="4", help="comma-separated LoRA counts (0 is always run)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.manual_seed(0)
    echo = print
    echo(
        f"GGUF + {args.loras} LoRAs (rank {args.rank}) through Ferry (RAM tier) on "
        f"{args.device}, {args.dtype}: {args.depth} blocks of width {args.width}, "
        f"{args.tokens} tokens, {args.rounds} rounds, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    lines = [
        "| quant | row | s/forward (median) | x ferry-0lora | equal to ComfyUI-GGUF |",
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
