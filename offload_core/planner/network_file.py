"""A network's figures from its file's header alone (no weight read): its bytes as loaded,
its repeated blocks, and whether the disk tier can read it in place.

The blocks are found from the keys as model/grouping.py finds them in modules: keys
``<list>.<i>.<rest>`` with two or more indices under the same ``<list>`` are a block list,
the top-most one where lists nest. Every list's blocks are kept in key order (grouping cuts
each list into groups), and the longest list bounds blocks per group.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Callable

import torch

from ..formats.header import StoredTensor
from ..formats.safetensors import read_checkpoint_header
from .facts import Kind, NetworkFacts, Wish

_INDEXED = re.compile(r"^(.*?)\.(\d+)\.(.+)$")


def loaded_bytes(t: StoredTensor, cast: torch.dtype | None) -> int:
    """A tensor's bytes as the host loads it: floating tensors in ``cast`` where given (a
    CPU host loads bf16 as float32), the rest as stored (a GGUF tensor's raw blocks)."""
    if cast is None or not t.dtype.is_floating_point:
        return t.nbytes
    numel = 1
    for s in t.shape:
        numel *= s
    return numel * cast.itemsize


def block_lists(sizes: dict[str, int]) -> list[list[int]]:
    """Each block list's blocks' bytes, in index order; top-most lists only. As grouping.py
    counts only lists of composite blocks, a list whose items hold their tensors themselves
    (``controlnet_blocks.3.weight``: a list of Linears, a Sequential of convs) is no block
    list: counted, it would let the plan ask for more blocks per group than the network has."""
    lists: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    composite: dict[str, dict[int, bool]] = defaultdict(lambda: defaultdict(bool))
    for key, n in sizes.items():
        m = _INDEXED.match(key)
        if m:
            lists[m.group(1)][int(m.group(2))] += n
            composite[m.group(1)][int(m.group(2))] |= "." in m.group(3)
    found = {p: b for p, b in lists.items() if len(b) >= 2 and all(composite[p][i] for i in b)}
    top = [p for p in found if not any(p != q and p.startswith(q + ".") for q in found)]
    return [[found[p][i] for i in sorted(found[p])] for p in sorted(top)]


def main_dtype(entries: list[StoredTensor]) -> tuple[torch.dtype | None, int]:
    """The floating dtype holding the most bytes, and the floating parameter count."""
    by_dtype: dict[torch.dtype, int] = defaultdict(int)
    params = 0
    for t in entries:
        if t.dtype.is_floating_point:
            by_dtype[t.dtype] += t.nbytes
            params += t.nbytes // t.dtype.itemsize
    return max(by_dtype, key=lambda d: by_dtype[d], default=None), params


def network_from_file(
    path: str | os.PathLike[str],
    *,
    name: str,
    kind: Kind,
    prefix: str = "",
    cast: torch.dtype | Callable[[torch.dtype, int], torch.dtype | None] | None = None,
    reads_per_prompt: float = 1.0,
    wish: Wish | None = None,
    held_bytes: int = 0,
    setting: str = "file",
) -> NetworkFacts:
    """The network under ``prefix`` in ``path`` (a .safetensors or .gguf; a ConfigError
    naming ``setting`` where it cannot be read). Reads the header only. ``cast``: the dtype
    the host loads floating tensors in, None (as stored), or a function of the file's main
    floating dtype and floating parameter count (ComfyUI's ``unet_dtype`` takes both)."""
    header = read_checkpoint_header(path, setting)
    mine = {k: t for k, t in header.entries.items() if k.startswith(prefix)}
    if callable(cast):
        stored, params = main_dtype(list(mine.values()))
        cast = cast(stored, params) if stored is not None else None
    sizes = {k[len(prefix) :]: loaded_bytes(t, cast) for k, t in mine.items()}
    lists = block_lists(sizes)
    blocks = tuple(b for blocks in lists for b in blocks)
    verbatim = all(loaded_bytes(t, cast) == t.nbytes for t in mine.values())
    return NetworkFacts(
        name=name,
        kind=kind,
        nbytes=sum(sizes.values()),
        block_bytes=blocks,
        longest_list=max((len(b) for b in lists), default=0),
        file=os.fspath(path),
        reads_per_prompt=reads_per_prompt,
        in_place=verbatim,
        held_bytes=held_bytes,
        wish=wish or Wish(),
    )
