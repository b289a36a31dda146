"""A network's figures from its file's header alone (no weight read): its bytes as the host
holds them (stored_sizes.py's table), its repeated blocks, and whether the disk tier can read
it in place.

The blocks are found from the keys as model/grouping.py finds them in modules: keys
``<list>.<i>.<rest>`` with two or more indices under the same ``<list>`` are a block list,
the top-most one where lists nest. Every list's blocks are kept in key order (grouping cuts
each list into groups), and the longest list bounds blocks per group.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Collection, Iterable

from ..formats.gguf import MAGIC
from ..formats.safetensors import read_checkpoint_header
from .facts import Kind, NetworkFacts, Wish
from .stored_sizes import CORE_FORMATS, Cast, held_sizes

_INDEXED = re.compile(r"^(.*?)\.(\d+)\.(.+)$")


def block_lists(sizes: dict[str, int]) -> list[list[int]]:
    """Each block list's blocks' bytes, in index order; top-most lists only. As grouping.py
    counts only lists of composite blocks, a list whose items hold their tensors themselves
    (``controlnet_blocks.3.weight``: a list of Linears, a Sequential of convs) is no block
    list: counted, it would let the plan ask for more blocks per group than the network has."""
    top, found = _lists(sizes)
    return [[found[p][i] for i in sorted(found[p])] for p in sorted(top)]


def _lists(sizes: dict[str, int]) -> tuple[list[str], dict[str, dict[int, int]]]:
    lists: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    composite: dict[str, dict[int, bool]] = defaultdict(lambda: defaultdict(bool))
    for key, n in sizes.items():
        m = _INDEXED.match(key)
        if m:
            lists[m.group(1)][int(m.group(2))] += n
            composite[m.group(1)][int(m.group(2))] |= "." in m.group(3)
    found = {p: b for p, b in lists.items() if len(b) >= 2 and all(composite[p][i] for i in b)}
    top = [p for p in found if not any(p != q and p.startswith(q + ".") for q in found)]
    return top, found


def list_prefixes(keys: Iterable[str]) -> list[str]:
    """The block lists' key prefixes (``blocks`` of ``blocks.3.attn.qkv.weight``), as
    ``block_lists`` finds them; what a torchao preset's "inside the blocks" means in a file."""
    return _lists(dict.fromkeys(keys, 0))[0]


def network_from_file(
    path: str | os.PathLike[str],
    *,
    name: str,
    kind: Kind,
    prefix: str = "",
    cast: Cast = None,
    preset: str | None = None,
    keeps: Collection[str] = CORE_FORMATS,
    reads_per_prompt: float = 1.0,
    wish: Wish | None = None,
    held_bytes: int = 0,
    setting: str = "file",
) -> NetworkFacts:
    """The network under ``prefix`` in ``path`` (a .safetensors or .gguf; a ConfigError
    naming ``setting`` where it cannot be read), each tensor as the host holds it
    (stored_sizes.py). Reads the header only. ``cast``: the dtype the host loads plain
    floating tensors in, None (as stored), or a function of the file's main plain floating
    dtype and its parameter count (ComfyUI's ``unet_dtype`` takes both). ``preset``: the
    torchao preset its loader quantizes the blocks' Linears with (None: none). ``keeps``:
    core's quantized formats the host loads as such (stored_sizes.CORE_FORMATS)."""
    header = read_checkpoint_header(path, setting)
    mine = {k[len(prefix) :]: t for k, t in header.entries.items() if k.startswith(prefix)}
    held = held_sizes(
        mine,
        header.metadata,
        gguf=header.raw[:4] == MAGIC,
        cast=cast,
        preset=None if preset == "none" else preset,
        blocks=list_prefixes(mine) if preset else (),
        prefix=prefix,
        keeps=keeps,
    )
    sizes = {k: t.nbytes for k, t in held.tensors.items()}
    lists = block_lists(sizes)
    blocks = tuple(b for blocks in lists for b in blocks)
    return NetworkFacts(
        name=name,
        kind=kind,
        nbytes=held.nbytes,
        block_bytes=blocks,
        longest_list=max((len(b) for b in lists), default=0),
        file=os.fspath(path),
        reads_per_prompt=reads_per_prompt,
        in_place=held.verbatim,
        held_bytes=held_bytes,
        wish=wish or Wish(),
        transient_bytes=held.transient,
    )
