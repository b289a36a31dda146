"""The safetensors format: Ferry's one codec (one dtype table, a header parser with bounds
checks), read and written one tensor at a time.

Why not the safetensors package: ``load_file`` gives the whole file at once, and ``save_file``
serialises every tensor into one in-memory buffer first, so both hold a full copy of the model
in RAM. The loader's memory bound needs one layer at a time: tensors are read at the header's
offsets straight into their destination (or a reused staging buffer) by the disk tier's reads
(``disk/reader.py``: this module only says where each tensor is), and written from their own
memory. The files stay ordinary safetensors files that the package reads.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO

import torch

from ..errors import ConfigError
from ..units import PAGE
from .gguf import is_gguf, read_gguf_header
from .header import Header, HeaderError, StoredTensor

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "C64": torch.complex64,
}
if hasattr(torch, "float8_e8m0fnu"):
    DTYPES["F8_E8M0"] = torch.float8_e8m0fnu
NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 100 << 20  # the safetensors package's own limit


def read_header(path: str | os.PathLike[str]) -> Header:
    """Parses and checks a safetensors header; HeaderError says what is wrong."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise HeaderError(f"{path} is {size} bytes, too short for a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise HeaderError(f"{path} declares a {n}-byte header in a {size}-byte file")
        raw = f.read(n)
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HeaderError(f"{path} has an unreadable header ({e})") from None
    if not isinstance(doc, dict):
        raise HeaderError(f"{path}: the header is not a JSON object")
    metadata = doc.pop("__metadata__", None) or {}
    base = 8 + n
    entries: dict[str, StoredTensor] = {}
    for key, info in doc.items():
        try:
            dtype = DTYPES[info["dtype"]]
            shape = tuple(int(s) for s in info["shape"])
            lo, hi = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise HeaderError(
                f"{path}: tensor {key!r} has a malformed or unsupported entry {info!r}"
            ) from None
        numel = 1
        for s in shape:
            numel *= s
        if hi - lo != numel * dtype.itemsize or lo < 0 or base + hi > size:
            raise HeaderError(f"{path}: tensor {key!r} has offsets {lo}..{hi} that do not fit")
        entries[key] = StoredTensor(key, dtype, shape, base + lo, base + hi)
    return Header(path, entries, dict(metadata), head + raw, size)


def read_checkpoint_header(path: str | os.PathLike[str], setting: str = "checkpoint") -> Header:
    """The one way a user's checkpoint is opened (sources/checkpoint.py: CheckpointIndex):
    ``read_header`` with every problem a ConfigError naming ``setting``. A GGUF file (by its
    magic) is indexed by formats/gguf.py the same way: its tensors are verbatim too."""
    if not os.path.isfile(path):
        raise ConfigError(
            setting, f"{os.fspath(path)!r} is not a file; choose a .safetensors or .gguf file"
        )

    gguf = is_gguf(path)
    try:
        return read_gguf_header(path) if gguf else read_header(path)
    except (HeaderError, OSError) as e:
        name = os.path.basename(os.fspath(path))
        kind = "GGUF" if gguf else "safetensors"
        raise ConfigError(
            setting, f"{name} cannot be read as {kind} ({e}); choose another file"
        ) from None


def byte_view(t: torch.Tensor) -> memoryview:
    """A writable view of a contiguous CPU tensor's bytes (no numpy, works for every dtype)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("byte_view needs a contiguous CPU tensor")
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    buf = (ctypes.c_char * n).from_address(t.data_ptr())
    buf._owner = t  # type: ignore[attr-defined]  # the view keeps the tensor's memory alive
    return memoryview(buf).cast("B")


def write_file(
    f: BinaryIO,
    specs: Iterable[tuple[str, torch.dtype, tuple[int, ...]]],
    metadata: dict[str, str],
    tensors: Iterable[tuple[str, torch.Tensor]],
    write: Callable[[BinaryIO, memoryview], Any] | None = None,
) -> int:
    """Writes a safetensors file: header from ``specs``, then ``tensors`` in the same order.

    ``tensors`` may be a generator, so only one tensor (layer) need exist at a time.
    Returns the bytes written.
    """
    header: dict[str, Any] = {"__metadata__": metadata}
    order = []
    offset = 0
    for key, dtype, shape in specs:
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * dtype.itemsize
        header[key] = {
            "dtype": NAMES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        order.append((key, nbytes))
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    put = write or _write_all
    put(f, memoryview(struct.pack("<Q", len(raw)) + raw))
    done = 8 + len(raw)
    expected = iter(order)
    for key, t in tensors:
        want_key, nbytes = next(expected)
        if key != want_key or t.numel() * t.element_size() != nbytes:
            raise ValueError(f"tensor {key!r} does not match the header's {want_key!r}")
        put(f, byte_view(t.detach().cpu().contiguous()))
        done += nbytes
    return done


def _write_all(f: BinaryIO, view: memoryview) -> None:
    f.write(view)


def aligned_header(table: dict[str, Any], data_len: int, align: int = PAGE) -> bytes:
    """A header for ``table`` (key -> {dtype, shape, data_offsets}, plus ``__metadata__``)
    whose data section starts on an ``align`` boundary.

    safetensors wants the data section fully covered, so the gaps between tensors (Ferry
    places each at a 64-byte offset, as the allocator would) become ``U8`` padding tensors, and
    the JSON is padded with spaces up to the boundary.
    """
    spans = sorted(
        (info["data_offsets"][0], info["data_offsets"][1], key)
        for key, info in table.items()
        if key != "__metadata__"
    )
    full: dict[str, Any] = {"__metadata__": table.get("__metadata__", {})}
    pos = 0
    for start, end, key in spans:
        if start > pos:
            full[f"__ferry_pad_{pos}"] = _pad(pos, start)
        full[key] = table[key]
        pos = end
    if pos < data_len:
        full[f"__ferry_pad_{pos}"] = _pad(pos, data_len)
    raw = json.dumps(full, separators=(",", ":")).encode()
    total = (8 + len(raw) + align - 1) // align * align
    raw += b" " * (total - 8 - len(raw))
    return struct.pack("<Q", len(raw)) + raw


def _pad(start: int, end: int) -> dict[str, Any]:
    return {"dtype": "U8", "shape": [end - start], "data_offsets": [start, end]}
