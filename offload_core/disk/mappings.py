"""The files a placement's tensors view while their group does not compute: one private
mapping per file (a group file, or the user's checkpoint read verbatim), made on first use and
let go before the file is replaced or deleted.

The mappings are copy-on-write (``ACCESS_COPY``): a stray in-place write from user code lands
in a private copy and never reaches the file. A view of a mapping holds no RAM until touched
(its pages are page cache), so the model reads as usual between forwards.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import torch

from ..model.layout import Entry
from .plan import ReadPlan


class Mappings:
    def __init__(self) -> None:
        self._by_path: dict[str, tuple[mmap.mmap, torch.Tensor]] = {}

    def of(self, plan: ReadPlan) -> mmap.mmap:
        """The file's mapping (``MappedSource`` computes from it)."""
        return self._mapped(plan)[0]

    def group_forms(self, entries: list[Entry], plan: ReadPlan) -> list[torch.Tensor]:
        """Views of a group file's mapping at the slab's offsets (its data starts at the
        first chunk's file offset; the tensors keep their 64-byte alignment)."""
        data = self._mapped(plan)[1][plan.chunks[0].file_offset :]
        return [e.build(data) for e in entries]

    def checkpoint_forms(self, entries: list[Entry], plan: ReadPlan) -> list[torch.Tensor]:
        """Views of a checkpoint's mapping at each tensor's stored bytes."""
        whole = self._mapped(plan)[1]
        at = {c.buf_offset: c.file_offset for c in plan.chunks}
        forms = []
        for e in entries:
            views = [
                whole[at[p.offset] : at[p.offset] + p.nbytes].view(p.dtype).view(p.size)
                for p in e.parts
            ]
            forms.append(e.around(views))  # a quantized weight: its data and scale, rebuilt
        return forms

    def forget(self, path: Path) -> None:
        """Lets go of the file's mapping (it closes with its last view): before the file is
        replaced (Windows refuses to replace a mapped file)."""
        self._by_path.pop(str(path), None)

    def clear(self) -> None:
        self._by_path.clear()

    def _mapped(self, plan: ReadPlan) -> tuple[mmap.mmap, torch.Tensor]:
        key = str(plan.path)
        if key not in self._by_path:
            mm = mmap.mmap(plan.fd, 0, access=mmap.ACCESS_COPY)
            self._by_path[key] = (mm, torch.frombuffer(mm, dtype=torch.uint8))
        return self._by_path[key]
