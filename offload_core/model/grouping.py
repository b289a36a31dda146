"""Splitting a model into groups: block level (repeated block lists) or leaf level."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..errors import GroupingError
from ..policy import BlockLevel, Level
from ..units import PAGE
from .layout import Entry, align_up, entry_end, make_entry, tensor_nbytes


@dataclass
class GroupSpec:
    """A set of modules whose tensors move together, packed into one slab."""

    index: int
    name: str
    modules: list[tuple[str, nn.Module]]
    entries: list[Entry] = field(default_factory=list)
    nbytes: int = 0  # the slab's size (page-aligned)

    @property
    def tensor_bytes(self) -> int:
        return sum(p.nbytes for e in self.entries for p in e.parts)


@dataclass
class Grouping:
    groups: list[GroupSpec]
    #: (module, attr, is_param) of tensors that stay on the onload device: everything outside
    #: the groups, and tensors shared between groups (one copy cannot live in two slots).
    resident: list[tuple[nn.Module, str, bool]]
    resident_bytes: int
    longest_block_list: int


def _has_params(m: nn.Module) -> bool:
    return any(True for _ in m.parameters())


def find_block_lists(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The top-most ModuleList/Sequential containers of >= 2 same-class composite blocks."""
    found: list[tuple[str, nn.Module]] = []
    for name, mod in model.named_modules():
        if any(name == f or name.startswith(f + ".") for f, _ in found if f):
            continue
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)) or len(list(mod.children())) < 2:
            continue
        children = list(mod.children())
        kinds = {type(c) for c in children}
        if len(kinds) != 1:
            continue
        if all(_has_params(c) and any(True for _ in c.children()) for c in children):
            found.append((name, mod))
    return found


def _chunks(
    level: Level, model: nn.Module
) -> tuple[list[tuple[str, list[tuple[str, nn.Module]]]], int]:
    if isinstance(level, BlockLevel):
        lists = find_block_lists(model)
        if not lists:
            raise GroupingError(
                "level",
                f"{type(model).__name__} has no list of repeated blocks (an nn.ModuleList of "
                "same-class blocks) to group; use level='leaf' to offload layer by layer",
            )
        longest = max(len(list(m.children())) for _, m in lists)
        n = level.blocks_per_group
        if n > longest:
            raise GroupingError(
                "blocks_per_group",
                f"is {n} but the longest block list of {type(model).__name__} has {longest} "
                f"blocks; set blocks_per_group between 1 and {longest}",
            )
        out = []
        for lname, lst in lists:
            blocks = [(f"{lname}.{i}", b) for i, b in enumerate(lst.children())]
            for start in range(0, len(blocks), n):
                chunk = blocks[start : start + n]
                end = start + len(chunk) - 1
                label = f"{lname}.{start}" if len(chunk) == 1 else f"{lname}.{start}-{end}"
                out.append((label, chunk))
        return out, longest
    leaves = [
        (name, m)
        for name, m in model.named_modules()
        if not any(True for _ in m.children())
        and (any(True for _ in m.parameters(recurse=False)) or m._buffers)
    ]
    if not leaves:
        raise GroupingError("level", f"{type(model).__name__} has no layer with weights to offload")
    # The block lists still bound blocks_per_group if the user switches to block level.
    longest = max((len(list(m.children())) for _, m in find_block_lists(model)), default=0)
    return [(name or type(model).__name__, [(name, m)]) for name, m in leaves], longest


def _tensors(prefix: str, mod: nn.Module) -> list[tuple[nn.Module, str, str, bool]]:
    out = []
    for mname, m in mod.named_modules(prefix=prefix):
        for attr, p in m._parameters.items():
            if p is not None:
                out.append((m, attr, f"{mname}.{attr}" if mname else attr, True))
        for attr, b in m._buffers.items():
            if b is not None:
                out.append((m, attr, f"{mname}.{attr}" if mname else attr, False))
    return out


#: One tensor of a group: (module, attr, qualified name, is_param, id of the tensor).
_Item = tuple[nn.Module, str, str, bool, int]


def _table(m: nn.Module, is_param: bool) -> dict[str, Any]:
    return m._parameters if is_param else m._buffers


def _collect_owners(
    model: nn.Module, chunks: list[tuple[str, list[tuple[str, nn.Module]]]]
) -> tuple[list[list[_Item]], dict[int, set[int]], list[tuple[nn.Module, str, bool]]]:
    """Each chunk's tensors; which groups (-1: outside any group) hold each tensor object;
    and the tensors of modules outside every group."""
    owners: dict[int, set[int]] = {}
    per_group = []
    for gi, (_, mods) in enumerate(chunks):
        items = []
        for qn, m in mods:
            for m2, attr, q2, is_param in _tensors(qn, m):
                t = _table(m2, is_param)[attr]
                owners.setdefault(id(t), set()).add(gi)
                items.append((m2, attr, q2, is_param, id(t)))
        per_group.append(items)
    in_groups = {id(m2) for items in per_group for (m2, *_rest) in items}
    outside: list[tuple[nn.Module, str, bool]] = []
    for m, attr, _q, is_param in _tensors("", model):
        if id(m) not in in_groups:
            owners.setdefault(id(_table(m, is_param)[attr]), set()).add(-1)
            outside.append((m, attr, is_param))
    return per_group, owners, outside


def _pack_group(
    g: GroupSpec,
    items: list[_Item],
    owners: dict[int, set[int]],
    resident: list[tuple[nn.Module, str, bool]],
    seen_resident: set[int],
) -> None:
    """Lays ``items`` out in ``g``'s slab; a tensor in two places (one copy cannot live in
    two slots) and a subclass buffer stay resident instead (appended to ``resident``)."""
    seen: set[int] = set()
    offset = 0
    for m2, attr, q2, is_param, tid in items:
        if tid in seen:
            continue
        seen.add(tid)
        if len(owners[tid]) > 1:
            if tid not in seen_resident:
                seen_resident.add(tid)
                resident.append((m2, attr, is_param))
            continue
        t = _table(m2, is_param)[attr]
        assert t is not None
        if not is_param and _is_subclass(t):
            resident.append((m2, attr, is_param))
            continue
        e = make_entry(m2, attr, q2, is_param, offset)
        g.entries.append(e)
        offset = entry_end(e)
    g.nbytes = align_up(max(offset, 1), PAGE)


def build_grouping(model: nn.Module, level: Level) -> Grouping:
    chunks, longest = _chunks(level, model)
    per_group, owners, outside = _collect_owners(model, chunks)
    groups: list[GroupSpec] = []
    resident = list(outside)
    seen_resident: set[int] = set()
    for (label, mods), items in zip(chunks, per_group):
        g = GroupSpec(index=len(groups), name=label, modules=mods)
        _pack_group(g, items, owners, resident, seen_resident)
        if g.entries:
            groups.append(g)
    # A tensor reachable from several modules outside groups is counted once.
    uniq: dict[int, int] = {}
    for m, attr, is_param in resident:
        t = _table(m, is_param)[attr]
        if t is not None:
            uniq[id(t)] = tensor_nbytes(t)
    return Grouping(groups, resident, sum(uniq.values()), longest)


def _is_subclass(t: object) -> bool:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return is_traceable_wrapper_subclass(t)
