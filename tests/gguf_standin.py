"""A stand-in for ComfyUI-GGUF's weights, layers and loader, for CI (which has no ComfyUI).

Written from ComfyUI-GGUF's public behaviour (city96/ComfyUI-GGUF, its December 2025
snapshot), with none of its code; the opt-in suite (tests/comfyui/test_comfyui_gguf.py) runs the
real pack. What it keeps, each from the file named:
- ``ops.py`` ``GGMLTensor``: a plain ``torch.Tensor`` subclass (no ``__torch_dispatch__``, no
  ``__tensor_flatten__``). Its storage holds the file's raw bytes (quantized blocks as uint8;
  F16/F32 as their dtype). Three Python attributes: ``tensor_type`` (the GGML type),
  ``tensor_shape`` (the dequantized shape, which ``.shape`` reports; ``.size()`` still gives
  the bytes' shape) and ``patches`` (LoRA patches, applied on every forward). ``clone()`` and
  ``detach()`` return the tensor itself; ``.to()`` carries the attributes (patches copied).
  ``nn.Parameter(t)`` of it is the same object (Parameter keeps a subclass by marking it).
- ``ops.py`` ``GGMLLayer``: every forward dequantizes the weight and bias it holds now, then
  adds the patches; nothing dequantized is kept.
- ``loader.py`` ``gguf_sd_loader``: ``gguf.GGUFReader`` maps the file; each tensor is
  ``torch.from_numpy`` of the reader's (memory-mapped) data, wrapped as a GGMLTensor whose
  ``tensor_shape`` is the GGUF dims reversed.
- ``nodes.py`` ``GGUFModelPatcher.clone``: the clone's ``__class__`` is set back to the pack's
  own patcher class, whatever subclass the source was (``clone_resets_class`` below).
Dequantizing uses the ``gguf`` package's own decoders (``gguf.quants.dequantize``), as the
pack falls back to for types it has no torch kernel for: the arithmetic differs from the
pack's torch kernels, but the same in the resident and the offloaded run, which is what the
tests compare.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from torch import nn

from bench.k_quant import k_quant_bytes

T = gguf.GGMLQuantizationType
UNQUANTIZED = (T.F32, T.F16)


class GGMLStandin(torch.Tensor):
    """See the module docstring (ComfyUI-GGUF's GGMLTensor)."""

    tensor_type: Any
    tensor_shape: torch.Size
    patches: list[Any]

    def __new__(
        cls, data: torch.Tensor, *, tensor_type: Any, tensor_shape: torch.Size, patches: Any = ()
    ) -> GGMLStandin:
        return super().__new__(cls, data)  # type: ignore[call-arg]

    def __init__(
        self, data: torch.Tensor, *, tensor_type: Any, tensor_shape: torch.Size, patches: Any = ()
    ) -> None:
        super().__init__()
        self.tensor_type = tensor_type
        self.tensor_shape = torch.Size(tensor_shape)
        self.patches = list(patches)

    @property  # type: ignore[override]
    def shape(self) -> torch.Size:
        return self.__dict__.get("tensor_shape", self.size())

    def clone(self, *args: Any, **kwargs: Any) -> GGMLStandin:  # type: ignore[override]
        return self

    def detach(self, *args: Any, **kwargs: Any) -> GGMLStandin:  # type: ignore[override]
        return self

    def to(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        moved = super().to(*args, **kwargs)
        moved.tensor_type = getattr(self, "tensor_type", None)
        moved.tensor_shape = getattr(self, "tensor_shape", moved.size())
        moved.patches = list(getattr(self, "patches", []))
        return moved


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's storage as a plain tensor (what the file holds)."""
    return t.as_subclass(torch.Tensor)


def dequantize(t: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    qtype = getattr(t, "tensor_type", None)
    raw = raw_bytes(t)
    if qtype is None or qtype in UNQUANTIZED:
        return raw.to(dtype)
    values = gguf.quants.dequantize(raw.cpu().numpy(), qtype)
    return torch.from_numpy(values).reshape(t.tensor_shape).to(raw.device, dtype)  # type: ignore[attr-defined]


def weight_now(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """What the layer computes with on this forward: dequantized, then each patch added."""
    if t is None:
        return None
    w = dequantize(t, dtype)
    for delta, strength in getattr(t, "patches", []):
        w = w + strength * delta.to(w.device, dtype)
    return w


class GGMLLinear(nn.Module):
    """ComfyUI-GGUF's Linear: dequantizes on every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.weight: nn.Parameter | None = None
        self.bias: nn.Parameter | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = weight_now(self.weight, x.dtype)
        assert w is not None
        return nn.functional.linear(x, w, weight_now(self.bias, x.dtype))


class GGMLNorm(nn.Module):
    """A LayerNorm whose affine parameters are F32 GGML tensors (as the pack's LayerNorm)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight: nn.Parameter | None = None
        self.bias: nn.Parameter | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = weight_now(self.weight, x.dtype), weight_now(self.bias, x.dtype)
        return nn.functional.layer_norm(x, (x.shape[-1],), w, b)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = GGMLNorm()
        self.a = GGMLLinear()
        self.b = GGMLLinear()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.nn.functional.gelu(self.a(self.norm(x))))


class GGUFNet(nn.Module):
    """A small DiT-shaped network of GGML layers: an input layer, a list of blocks, an output
    layer. Its weights come from a .gguf file (``load_gguf_into``)."""

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.inp = GGMLLinear()
        self.blocks = nn.ModuleList([Block() for _ in range(depth)])
        self.out = GGMLLinear()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


WIDTH = 256  # one K-quant block per row (GGML's K-quants pack 256 values a block)


#: Which GGML type each kind of file gives each tensor, as GGUF conversion tools do: big 2-D
#: weights quantized, small and non-2-D ones F16/F32.
MIXES = {
    "q8_0": {"weight": T.Q8_0, "inp": T.Q8_0, "small": T.F32},
    "k": {"weight": T.Q4_K, "inp": T.Q5_K, "small": T.F16},
}


def write_gguf(path: Path, mix: str, depth: int = 4, seed: int = 0) -> Path:
    """A real .gguf file (``gguf.GGUFWriter``) with GGUFNet's tensors."""
    rng = np.random.default_rng(seed)
    types = MIXES[mix]
    writer = gguf.GGUFWriter(str(path), arch="ferry-test")

    def add(name: str, shape: tuple[int, ...], qtype: Any) -> None:
        if qtype in UNQUANTIZED:
            dt = np.float32 if qtype == T.F32 else np.float16
            values = (rng.standard_normal(shape) * (1.0 if len(shape) == 1 else 0.05)).astype(dt)
            writer.add_tensor(name, values, raw_dtype=qtype)
        elif qtype in (T.Q4_K, T.Q5_K):
            writer.add_tensor(name, k_quant_bytes(shape[0], WIDTH, qtype, rng), raw_dtype=qtype)
        else:
            values = (rng.standard_normal(shape) * 0.05).astype(np.float32)
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    for name in ["inp", *[f"blocks.{i}.{ab}" for i in range(depth) for ab in "ab"], "out"]:
        add(f"{name}.weight", (WIDTH, WIDTH), types["inp" if name == "inp" else "weight"])
        add(f"{name}.bias", (WIDTH,), types["small"])
    for i in range(depth):
        add(f"blocks.{i}.norm.weight", (WIDTH,), T.F32)
        add(f"blocks.{i}.norm.bias", (WIDTH,), T.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def read_gguf(path: Path) -> dict[str, GGMLStandin]:
    """Each tensor as the pack's loader makes it: a GGMLTensor over the mapped file."""
    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        with warnings.catch_warnings():  # read-only, as the pack's: nothing writes to it
            warnings.simplefilter("ignore", UserWarning)
            data = torch.from_numpy(np.asarray(t.data))  # the memory map, not a copy
        shape = torch.Size(int(v) for v in reversed(t.shape))
        if t.tensor_type in UNQUANTIZED:
            data = data.view(shape)  # unquantized tensors take their shape, as the pack's do
        out[t.name] = GGMLStandin(data, tensor_type=t.tensor_type, tensor_shape=shape)
    return out


def load_gguf_into(model: nn.Module, path: Path) -> nn.Module:
    for key, t in read_gguf(path).items():
        owner_name, attr = key.rsplit(".", 1)
        setattr(model.get_submodule(owner_name), attr, nn.Parameter(t, requires_grad=False))
    return model


def gguf_model(path: Path, depth: int = 4) -> GGUFNet:
    return load_gguf_into(GGUFNet(depth), path).eval()  # type: ignore[return-value]


def attributes(model: nn.Module) -> dict[str, tuple[type, Any, torch.Size, list[Any], int]]:
    """What a layer sees of each weight: its type, the three attributes, and its identity."""
    return {
        k: (
            type(p),
            getattr(p, "tensor_type", None),
            getattr(p, "tensor_shape", None),
            list(getattr(p, "patches", [])),
            id(p),
        )
        for k, p in model.named_parameters()
    }


def clone_resets_class(own_class: type) -> Any:
    """A ``clone`` that behaves as GGUFModelPatcher's does: whatever subclass ``self`` is, the
    clone is made as ``own_class`` and its ``__class__`` is set back to ``own_class``."""

    def clone(self: Any, *args: Any, **kwargs: Any) -> Any:
        src_cls = self.__class__
        self.__class__ = own_class
        try:
            n = super(own_class, self).clone(*args, **kwargs)
        finally:
            self.__class__ = src_cls
        n.__class__ = own_class
        return n

    return clone
