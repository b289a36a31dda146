"""Small models for the tests: the demo DiT (two block lists) in each dtype, plain or
quantized by real torchao configs."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from offload_core.model.demo import build_demo_model, demo_inputs

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _quantize(model: nn.Module, quant: str) -> None:
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    config = {"int8": Int8WeightOnlyConfig(), "float8": Float8WeightOnlyConfig()}[quant]

    def in_blocks(module: nn.Module, fqn: str) -> bool:
        return isinstance(module, nn.Linear) and "blocks." in fqn

    quantize_(model, config, filter_fn=in_blocks)


def torchao_quantize(model: nn.Module, preset: str) -> None:
    """The reference quantization: torchao's own ``quantize_`` over the whole model, with the
    config each preset names and the layers Ferry's default rule picks, spelled out here: the
    Linears inside the block lists (the demo DiT's double_blocks and single_blocks, or a
    model's ``blocks``) with at least 128 x 128 weights (none of those is named *norm* or
    *embed*)."""
    if preset == "none":
        return
    from torchao.quantization import (
        Float8WeightOnlyConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        quantize_,
    )

    config = {
        "int8-weight": Int8WeightOnlyConfig,
        "int8-dynamic": Int8DynamicActivationInt8WeightConfig,
        "float8-weight": Float8WeightOnlyConfig,
    }[preset]()

    def in_blocks(module: nn.Module, fqn: str) -> bool:
        return (
            isinstance(module, nn.Linear)
            and fqn.split(".")[0] in ("double_blocks", "single_blocks", "blocks")
            and module.weight.numel() >= 128 * 128
        )

    quantize_(model, config, filter_fn=in_blocks)


def same_weights(got: nn.Module, want: nn.Module) -> None:
    """Every tensor of ``got`` is ``want``'s: the same class, and equal inner tensors."""
    a, b = got.state_dict(), want.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert type(a[k]) is type(b[k]), k
        names = a[k].__tensor_flatten__()[0] if hasattr(a[k], "__tensor_flatten__") else [None]
        for n in names:
            x, y = (a[k], b[k]) if n is None else (getattr(a[k], n), getattr(b[k], n))
            assert x.dtype == y.dtype and torch.equal(x, y), (k, n)


@functools.cache
def _reference(dtype: str, quant: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    model = make_model(dtype, quant, cached=False)
    x = demo_inputs(model, tokens=16, seed=3)
    with torch.no_grad():
        return x, model(**x)


def make_model(dtype: str, quant: str = "plain", cached: bool = True) -> nn.Module:
    model = build_demo_model(0.006, DTYPES[dtype], seed=7)
    if quant != "plain":
        _quantize(model, quant)
    return model


def reference(dtype: str, quant: str = "plain") -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Inputs and the resident model's output (computed once per kind)."""
    return _reference(dtype, quant)


def snapshot(model: nn.Module) -> tuple[dict[str, torch.Tensor], list[int], dict[str, type]]:
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return (
        sd,
        [id(p) for p in model.parameters()],
        {k: type(v) for k, v in model.state_dict().items()},
    )


def state_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if type(x) is not type(y) or x.device != y.device or x.dtype != y.dtype:
            return False
        if hasattr(x, "__tensor_flatten__"):
            names, _ = x.__tensor_flatten__()
            if not all(torch.equal(getattr(x, n), getattr(y, n)) for n in names):
                return False
        elif not torch.equal(x, y):
            return False
    return True


@contextlib.contextmanager
def tmpfs(path: Path, size: str, readonly: bool = False) -> Iterator[Path]:
    """A real small filesystem: real ENOSPC, real read-only mount (needs root, as CI has)."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if readonly else "")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def flip_byte(path: Path, at_end: int = 1000, keep_mtime: bool = False) -> int:
    """Flips bit 6 of the byte ``at_end`` bytes before the end of ``path`` (flipping it again
    puts it back) and returns the byte's old value. ``keep_mtime``: size and mtime look
    untouched afterwards, only the ctime tells."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size - at_end)
        b = f.read(1)[0]
        f.seek(st.st_size - at_end)
        f.write(bytes([b ^ 0x40]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return b


class Uneven(nn.Module):
    """Leaf modules of very uneven sizes (fp32): a 1 MiB Linear, quarter- and half-size ones,
    few-KB norms, in an order that makes the byte ring pack small groups into a slot and later
    put a bigger region over several of them ([Note: the schedule])."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [
                nn.Linear(64, 4096),  # 1 MiB: the largest group
                nn.Linear(4096, 16),  # quarter-size ones
                nn.Linear(16, 4096),
                nn.LayerNorm(4096),  # 32 KiB
                nn.Linear(4096, 16),
                nn.Linear(16, 4096),
                nn.Linear(4096, 64),  # 1 MiB
                nn.LayerNorm(64),  # 512 bytes
                nn.Linear(64, 2048),  # half-size ones
                nn.Linear(2048, 64),
                nn.LayerNorm(64),
                nn.Linear(64, 1024),  # a quarter
                nn.Linear(1024, 64),
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return x


def make_uneven_model(seed: int = 5) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The model (weights random but reproducible) and its inputs."""
    torch.manual_seed(seed)
    model = Uneven().eval().requires_grad_(False)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(seed + 1))
    return model, {"x": x}


def fail_first_read_with_eio(backend: object, monkeypatch: object) -> list[int]:
    """The next positioned read through ``backend`` (buffered or direct) raises EIO, later
    ones read; returns the list the failed descriptor is appended to."""
    import errno

    failed: list[int] = []

    def eio_once(real):  # type: ignore[no-untyped-def]
        def read(fd, into, offset):  # type: ignore[no-untyped-def]
            if not failed:
                failed.append(fd)
                raise OSError(errno.EIO, "Input/output error")
            return real(fd, into, offset)

        return read

    for name in ("pread", "pread_direct"):
        monkeypatch.setattr(backend, name, eio_once(getattr(backend, name)))  # type: ignore[attr-defined]
    return failed
