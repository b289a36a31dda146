"""The user's own safetensors checkpoint as a group's source: nothing written.

A group qualifies only when every tensor of it is stored in the checkpoint exactly as the
model holds it (same name, dtype, shape, contiguous) and the bytes there are the model's
(compared once, at apply). Reads land at the slab's 64-byte-aligned offsets, never computed
at the file's own offsets: weights at 8-byte-aligned addresses give different results.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import torch

from ..errors import DiskPathError, FerryError
from ..formats.safetensors import HeaderError, StoredTensor, read_header
from ..model.layout import Entry
from .reads import CHUNK, Chunk, ReadPlan, bytes_view, open_plan, read_chunk

Index = dict[str, StoredTensor]


def read_checkpoint_index(path: Path) -> Index:
    """The checkpoint's tensors by name; a clear error naming ``source_checkpoint``."""
    if not path.is_file():
        raise DiskPathError("source_checkpoint", f"{path} is not a file")
    try:
        return read_header(path).entries
    except (HeaderError, OSError) as e:
        raise DiskPathError(
            "source_checkpoint", f"{path} is not a readable safetensors file ({e})"
        ) from None


def find_prefix(names: list[str], index: Index) -> str | None:
    """The key prefix under which the model's tensor names appear in the checkpoint
    (ComfyUI checkpoints use e.g. ``model.diffusion_model.``)."""
    if not names:
        return None
    probe = names[0]
    for key in index:
        if key.endswith(probe):
            prefix = key[: len(key) - len(probe)]
            if prefix == "" or prefix.endswith("."):
                return prefix
    return None


def checkpoint_spans(
    entries: list[Entry], index: Index, prefix: str
) -> list[tuple[int, int, int]] | None:
    """(file_offset, buf_offset, nbytes) per tensor if every tensor of the group is stored in
    the checkpoint exactly as the model holds it; None otherwise. Bytes are compared by
    ``checkpoint_plan``."""
    out = []
    for e in entries:
        if e.subclass is not None:
            return None
        part = e.parts[0]
        t = index.get(prefix + e.qualname)
        if t is None or t.dtype != part.dtype or t.shape != part.size or not part.contiguous:
            return None
        if t.nbytes != part.nbytes or t.start % part.dtype.itemsize:
            return None
        out.append((t.start, part.offset, part.nbytes))
    return out


def checkpoint_plan(
    path: Path,
    entries: list[Entry],
    packed: torch.Tensor,
    index: Index,
    prefix: str,
    direct: bool = True,
) -> ReadPlan | None:
    """A plan that reads the group straight from the checkpoint, if the bytes there are
    exactly the model's (``packed``: the group's slab as the model holds it); ``direct``:
    with an O_DIRECT descriptor beside ([Note: the window read])."""
    spans = checkpoint_spans(entries, index, prefix)
    if spans is None:
        return None
    chunks = []
    for file_off, buf_off, n in spans:
        for o in range(0, n, CHUNK):
            m = min(CHUNK, n - o)
            crc = zlib.crc32(bytes_view(packed[buf_off + o : buf_off + o + m]))
            chunks.append(Chunk(file_off + o, buf_off + o, m, crc))
    plan = open_plan(path, chunks, owned=False, direct=direct)
    check = torch.empty_like(packed)
    try:
        for c in chunks:
            read_chunk(plan, c, check)  # raises on a mismatch: the weights changed
    except FerryError:
        plan.close()
        return None
    plan.verified = True
    return plan
