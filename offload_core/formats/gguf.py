"""The GGUF format's index: where each tensor's bytes are, as the safetensors parser gives it.

A GGUF file (llama.cpp's format, which ComfyUI-GGUF loads) stores every tensor verbatim at an
aligned offset after its header, quantized or not. ComfyUI-GGUF maps the file and wraps each
tensor's bytes as they are (quantized blocks as uint8, F16/F32 as their dtype), so a group
whose weights are unchanged can be read straight from the .gguf, as from a safetensors
checkpoint. This parser gives each tensor the dtype and shape the loader gives its storage
(``gguf.GGUFReader``'s: GGUF dims reversed; a quantized tensor as rows of bytes; F16/F32 in the
shape recorded under ``comfy.gguf.orig_shape.<name>`` where ComfyUI-GGUF's converter flattened
a tensor of more than four dimensions). Every offset is checked against the file's size.
No ``gguf`` package needed: the header is a short, fixed binary layout.
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO

import torch

from .header import Header, HeaderError, StoredTensor

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_COUNT = 1 << 24  # tensors or metadata pairs: far beyond any real file, bounds a bad one

#: GGML type id -> (values per block, bytes per block) (ggml.h / gguf-py's GGML_QUANT_SIZES;
#: tests/test_gguf_index.py checks it against the gguf package).
BLOCKS: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
    15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
    21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4),
    27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66),
    39: (32, 17), 40: (64, 36), 41: (128, 18),
}  # fmt: skip
#: The types a loader sees as typed values (F32, F16, I8, I16, I32, I64, F64); any other is
#: its blocks' bytes.
TYPED: dict[int, torch.dtype] = {
    0: torch.float32, 1: torch.float16, 24: torch.int8, 25: torch.int16, 26: torch.int32,
    27: torch.int64, 28: torch.float64,
}  # fmt: skip
ORIG_SHAPE = "comfy.gguf.orig_shape."

# Metadata value types: fixed-size scalars by struct format; 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # fmt: skip
_STRING, _ARRAY = 8, 9


def is_gguf(path: str | os.PathLike[str]) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


class _Reader:
    def __init__(self, f: BinaryIO, path: str) -> None:
        self.f, self.path = f, path

    def take(self, fmt: str) -> int | float | bool:
        size = struct.calcsize("<" + fmt)
        raw = self.f.read(size)
        if len(raw) != size:
            raise HeaderError(f"{self.path}: the GGUF header ends early")
        return struct.unpack("<" + fmt, raw)[0]  # type: ignore[no-any-return]

    def count(self) -> int:
        n = int(self.take("Q"))
        if n > MAX_COUNT:
            raise HeaderError(f"{self.path}: a GGUF count of {n} is not plausible")
        return n

    def string(self) -> str:
        n = int(self.take("Q"))
        if n > 1 << 20:
            raise HeaderError(f"{self.path}: a {n}-byte GGUF string is not plausible")
        raw = self.f.read(n)
        if len(raw) != n:
            raise HeaderError(f"{self.path}: the GGUF header ends early")
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int) -> object:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner = int(self.take("I"))
            return [self.value(inner) for _ in range(self.count())]
        raise HeaderError(f"{self.path}: unknown GGUF metadata type {kind}")


def read_gguf_header(path: str | os.PathLike[str]) -> Header:
    """Parses and checks a GGUF file's header; HeaderError says what is wrong. ``metadata``
    holds the string and number metadata (as text); ``raw`` the header's bytes."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        r = _Reader(f, path)
        if f.read(4) != MAGIC:
            raise HeaderError(f"{path} is not a GGUF file (no GGUF magic)")
        version = int(r.take("I"))
        if version not in (2, 3):
            raise HeaderError(f"{path}: GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_kv = r.count(), r.count()
        meta: dict[str, object] = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(int(r.take("I")))
        infos = []
        for _ in range(n_tensors):
            name = r.string()
            dims = [int(r.take("Q")) for _ in range(int(r.take("I")))]
            infos.append((name, dims, int(r.take("I")), int(r.take("Q"))))
        end_of_infos = f.tell()
        f.seek(0)
        raw = f.read(end_of_infos)
    align = int(meta.get("general.alignment", DEFAULT_ALIGNMENT))  # type: ignore[call-overload]
    base = (end_of_infos + align - 1) // align * align
    entries = {
        name: _entry(path, name, dims, t, base + off, size, meta) for name, dims, t, off in infos
    }
    text = {k: str(v) for k, v in meta.items() if not isinstance(v, list)}
    return Header(path, entries, text, raw, size)


def _entry(
    path: str,
    name: str,
    dims: list[int],
    gtype: int,
    start: int,
    size: int,
    meta: dict[str, object],
) -> StoredTensor:
    if gtype not in BLOCKS:
        raise HeaderError(f"{path}: tensor {name!r} has unknown GGML type {gtype}")
    block, block_bytes = BLOCKS[gtype]
    shape = tuple(reversed(dims)) or (1,)
    numel = 1
    for d in shape:
        numel *= d
    if shape[-1] % block:
        raise HeaderError(f"{path}: tensor {name!r} rows of {shape[-1]} are not whole blocks")
    nbytes = numel // block * block_bytes
    if start + nbytes > size:
        raise HeaderError(f"{path}: tensor {name!r} at {start}..{start + nbytes} does not fit")
    dtype = TYPED.get(gtype, torch.uint8)
    if dtype is torch.uint8 and gtype not in TYPED:
        shape = (*shape[:-1], shape[-1] // block * block_bytes)
    else:
        orig = meta.get(ORIG_SHAPE + name)
        if isinstance(orig, list) and _prod(orig) == numel:
            shape = tuple(int(d) for d in orig)
    return StoredTensor(name, dtype, shape, start, start + nbytes, gtype)


def _prod(xs: list[object]) -> int:
    out = 1
    for x in xs:
        out *= int(x)  # type: ignore[call-overload]
    return out
