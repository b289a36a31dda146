"""Checkpoint files of any declared size for the planner's tests: a real safetensors header
over a sparse data region (no disk used, nothing worth reading), and the bytes a piece of
code read (``/proc/self/io`` rchar: every read() of this process)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SIZES = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "U8": 1}


def sparse_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> Path:
    """A safetensors file holding ``tensors`` (key: (dtype, shape)); its data is a hole."""
    table: dict[str, object] = {}
    offset = 0
    for key, (dtype, shape) in tensors.items():
        n = SIZES[dtype]
        for s in shape:
            n *= s
        table[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(table).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        f.truncate(8 + len(head) + offset)
    return path


def dit_tensors(
    blocks: int, width: int, dtype: str = "BF16", prefix: str = ""
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """A DiT-shaped network: ``blocks`` blocks of two width x 4width Linears, plus an input
    and an output layer outside the blocks."""
    out = {f"{prefix}img_in.weight": (dtype, (width, 64))}
    for i in range(blocks):
        out[f"{prefix}blocks.{i}.mlp.0.weight"] = (dtype, (4 * width, width))
        out[f"{prefix}blocks.{i}.mlp.2.weight"] = (dtype, (width, 4 * width))
        out[f"{prefix}blocks.{i}.norm.scale"] = ("F32", (width,))
    out[f"{prefix}final.weight"] = (dtype, (64, width))
    return out


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


@contextmanager
def bytes_read() -> Iterator[list[int]]:
    """Counts the bytes this process reads inside the block: ``with bytes_read() as n``,
    then ``n[0]``."""
    out = [0]
    start = _rchar()
    try:
        yield out
    finally:
        out[0] = _rchar() - start
