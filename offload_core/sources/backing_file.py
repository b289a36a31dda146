"""Which checkpoint a model's tensors are still pages of, found from the tensors themselves.

A host's loader may leave the weights it loaded as views of the file's mapping (ComfyUI
v0.33's ``load_safetensors`` with dynamic VRAM, safetensors' own ``safe_open``), and keep no
path on the model. The disk tier can then read those groups straight from the file instead of
writing copies: this module says, for each tensor, which file and which of its keys it is.

A wrong answer must be impossible, so a tensor counts only where all of these hold:
- it lies in a mapping of a file that still has that path (the kernel's device and inode for
  the mapping are the path's now; an unlinked or replaced file is refused);
- that file reads as a safetensors checkpoint (its header parses and fits the file), and the
  mapping does not reach past the file's end (a file cut short since);
- the tensor starts exactly where the header puts a key's bytes, with that key's dtype and
  shape, and is contiguous.
The bytes are compared with the file's once more when the group's read plan is made
(``CheckpointIndex.read_plan_spans_if_same``): a page written in a private mapping since
(copy on write) is not the file's.
"""

from __future__ import annotations

import bisect
import mmap
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..disk.maps import MAPS, FileMapping, file_mappings
from ..errors import ConfigError
from .checkpoint import CheckpointIndex

#: The setting a refused file's error would name (never raised to the user: a refused file
#: only means its groups are written, and the note says why).
SETTING = "backing file"


@dataclass
class BackingFiles:
    """Each found tensor's file and key, by the caller's name for it; ``notes`` says which
    files were refused and why."""

    keys: dict[str, tuple[CheckpointIndex, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def files(self) -> list[Path]:
        seen: dict[str, Path] = {}
        for index, _ in self.keys.values():
            seen.setdefault(str(index.path), index.path)
        return list(seen.values())


def backing_files(tensors: Iterable[tuple[str, torch.Tensor]], maps: Path = MAPS) -> BackingFiles:
    """For each named plain CPU tensor that is a checkpoint's stored tensor, untouched in its
    mapping, the file's index and the key (see the module's docstring for the checks)."""
    mappings = file_mappings(maps)
    starts = [m.lo for m in mappings]
    found = BackingFiles()
    opened: dict[str, _File | None] = {}
    for name, t in tensors:
        if t.device.type != "cpu" or t.numel() == 0:
            continue
        addr = t.data_ptr()
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0 or not mappings[i].lo <= addr < mappings[i].hi:
            continue
        m = mappings[i]
        if m.path not in opened:
            opened[m.path] = _open(m, found.notes)
        f = opened[m.path]
        if f is None or not f.same_mapping(m, found.notes):
            continue
        key = f.key_at(addr - m.lo + m.offset, t)
        if key is not None:
            found.keys[name] = (f.index, key)
    return found


class _File:
    """A mapped file accepted as a checkpoint: its index, and its keys by start offset."""

    def __init__(self, index: CheckpointIndex, dev: tuple[int, int], inode: int) -> None:
        self.index = index
        self.dev, self.inode = dev, inode
        self.by_start = {st.start: st for st in index.entries.values() if st.ggml_type is None}
        #: The most a mapping of the file can span: its size in whole pages.
        self.mappable = -(-index.header.file_size // mmap.PAGESIZE) * mmap.PAGESIZE
        self.said_short = False

    def same_mapping(self, m: FileMapping, notes: list[str]) -> bool:
        """``m`` maps this very file (a second mapping of the same path, made after it was
        replaced, is another file) and ends within it."""
        if (m.dev, m.inode) != (self.dev, self.inode):
            return False
        if m.offset + (m.hi - m.lo) <= self.mappable:
            return True
        if not self.said_short:
            self.said_short = True
            notes.append(
                f"{self.index.path.name} is shorter than its mapping in memory (it was cut "
                "short since it was loaded): its groups are written"
            )
        return False

    def key_at(self, offset: int, t: torch.Tensor) -> str | None:
        """The key whose stored bytes ``t`` is, or None (a slice of a tensor, another dtype
        or shape: not the file's tensor as stored)."""
        st = self.by_start.get(offset)
        if st is None or st.dtype != t.dtype or st.shape != tuple(t.shape):
            return None
        if not t.is_contiguous():
            return None
        return st.key


def _open(m: FileMapping, notes: list[str]) -> _File | None:
    """The mapped file as a checkpoint, or None (with a note where it looked like one)."""
    if m.deleted:
        return None
    path = Path(m.path)
    try:
        st = os.stat(path)
    except OSError:
        return None
    if (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) != (*m.dev, m.inode):
        if path.suffix in (".safetensors", ".sft"):
            notes.append(
                f"{path.name} was replaced after it was loaded (another file has its path "
                "now): its groups are written"
            )
        return None
    if path.suffix not in (".safetensors", ".sft"):
        return None  # a library, a GGUF file (read through its own index), ...
    try:
        index = CheckpointIndex.open(path, SETTING)
    except ConfigError as e:
        notes.append(f"{path.name} does not read as a checkpoint ({e}): its groups are written")
        return None
    return _File(index, m.dev, m.inode)
