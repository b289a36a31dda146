"""Where each tensor of a group lives inside the group's one flat byte buffer.

A group's parameters and buffers are packed into one slab (pinned RAM, plain RAM, a group
file's data section, a device slot: all share this layout), so a whole group moves with one
copy. torchao tensors are stored as their inner plain tensors (qdata, scale, ...) and rebuilt
around views of the slab: ``param.data = x`` silently does nothing for a tensor subclass
(the wrapper keeps pointing at its old inner tensors), so subclass parameters are swapped with
``torch.utils.swap_tensors`` and keep their identity.

Any other tensor subclass (ComfyUI-GGUF's ``GGMLTensor``: a plain ``torch.Tensor`` subclass
whose storage holds raw quantized blocks and whose Python attributes drive its dequantization)
is moved as its storage's bytes, read through a plain view, never through what the subclass
reports (``GGMLTensor.shape`` is the dequantized shape, not the bytes'). Its module keeps the
same object (``.data =`` keeps a tensor's class and ``__dict__``), so the loader's per-forward
code sees the same type with the same attributes. What cannot be moved that way is refused,
naming the layer and the type, before anything moves (``unsupported_why``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..errors import FerryError, UnsupportedTensorError

#: Every tensor starts on a 64-byte boundary, as the allocator would place it: kernels pick
#: their vectorised paths from the data pointer's alignment, so weights at 8-byte-aligned
#: offsets give different (not bit-identical) results from the resident model.
ALIGN = 64


def align_up(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


def tensor_nbytes(t: torch.Tensor) -> int:
    """The bytes a tensor holds, counted the way Ferry lays it out.

    A traceable wrapper subclass (a torchao tensor) is counted by its inner tensors (an int8
    weight-only tensor: int8 qdata + its scale); ``numel() * element_size()`` would use the
    outer dtype, which describes the dequantized view, not the memory.
    """
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
        return sum(tensor_nbytes(getattr(t, n)) for n in names)
    p = plain_view(t)
    return p.numel() * p.element_size()


def plain_view(t: torch.Tensor) -> torch.Tensor:
    """``t``'s own bytes as a plain tensor (same storage, offset, sizes and strides): a plain
    subclass may report a shape that is not its data's (GGMLTensor reports the dequantized
    one), and what Ferry stores and copies are the bytes."""
    if type(t) is torch.Tensor or type(t) is nn.Parameter:
        return t
    try:
        return t.as_subclass(torch.Tensor)
    except RuntimeError:
        # A tensor made under inference_mode whose data was then set outside it (Forge makes
        # its GGUF parameters under inference_mode: a LoRA's backups, a forward's cast bias)
        # has no version counter for as_subclass to share; this alias needs none.
        return torch.Tensor._make_subclass(torch.Tensor, t)


def unsupported_why(t: torch.Tensor) -> str | None:
    """Why ``t`` cannot be moved bit-exact with its class and attributes kept, or None.

    Moved faithfully: a plain tensor; a traceable wrapper subclass (torchao: its inner tensors,
    rebuilt with its own ``__tensor_unflatten__``); a plain subclass whose data is its one
    strided storage (GGMLTensor), kept as the same object. Anything else would compute on
    bytes Ferry did not move, or not compute at all."""
    if t.layout != torch.strided:
        return f"its layout is {t.layout} (Ferry moves strided tensors)"
    if t.is_quantized:
        return "it is a PyTorch-quantized tensor (its scales live outside its bytes)"
    if getattr(t, "is_nested", False):
        return "it is a nested tensor"
    if is_traceable_wrapper_subclass(t) or type(t) is torch.Tensor or type(t) is nn.Parameter:
        return None
    dispatch = getattr(type(t), "__torch_dispatch__", None)
    if getattr(dispatch, "__func__", dispatch) is not _BASE_DISPATCH:
        # Its own dispatch decides what its storage means: without __tensor_flatten__ Ferry
        # cannot see which tensors hold its data.
        return "it overrides __torch_dispatch__ without __tensor_flatten__"
    storage = t.untyped_storage().data_ptr()
    for name, value in vars(t).items():
        if (
            isinstance(value, torch.Tensor)
            and storage != 0
            and value.untyped_storage().data_ptr() == storage
        ):
            # That attribute would keep pointing at the bytes Ferry moved away.
            return f"its attribute {name!r} is a view of its own data"
    return None


_BASE_DISPATCH = getattr(
    torch.Tensor.__torch_dispatch__, "__func__", torch.Tensor.__torch_dispatch__
)


def module_nbytes(module: nn.Module, on: torch.device | None = None) -> int:
    """The bytes of a module's parameters and buffers (children included), each tensor once
    (a tied weight reachable from two modules is one tensor); with ``on``, only those on a
    device of its type."""
    unique = {
        id(t): t
        for t in (*module.parameters(), *module.buffers())
        if on is None or t.device.type == on.type
    }
    return sum(tensor_nbytes(t) for t in unique.values())


@dataclass(frozen=True)
class Part:
    """One plain tensor stored at ``offset`` in a slab, with its own strides."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]

    def view(self, buf: torch.Tensor) -> torch.Tensor:
        flat = buf[self.offset : self.offset + self.nbytes].view(self.dtype)
        return flat.as_strided(self.size, self.stride)

    @property
    def contiguous(self) -> bool:
        return self.stride == _contiguous_stride(self.size)


def _contiguous_stride(size: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(size):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


def _non_overlapping_and_dense(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """True when the elements tile one span with no gap and no overlap (any dim order)."""
    dims = sorted((st, sz) for sz, st in zip(size, stride) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def _dense_stride(t: torch.Tensor) -> tuple[int, ...]:
    """Keeps a transposed weight transposed (kernels, and so results, depend on strides);
    anything overlapping or with gaps is stored contiguous."""
    if t.numel() > 0 and _non_overlapping_and_dense(tuple(t.size()), tuple(t.stride())):
        return tuple(t.stride())
    return _contiguous_stride(tuple(t.size()))


@dataclass
class Entry:
    """One parameter or buffer of a group: how to rebuild it around a slab."""

    module: nn.Module
    attr: str
    qualname: str
    is_param: bool
    parts: tuple[Part, ...]
    inner_names: tuple[str, ...]  # () for a plain tensor
    subclass: type | None
    ctx: Any
    outer_size: tuple[int, ...]
    outer_stride: tuple[int, ...]
    requires_grad: bool
    orig_device: torch.device
    #: Device forms built around a slot, by the region's offset in the ring, reused every
    #: forward (rebuilding a torchao wrapper costs ~90 us); runtime/group.py bounds it.
    slot_forms: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    # -- reading the tensor the module holds now ---------------------------------------
    def current(self) -> torch.Tensor:
        table = self.module._parameters if self.is_param else self.module._buffers
        t = table[self.attr]
        assert t is not None
        return t

    def inner_tensors(self, t: torch.Tensor) -> list[torch.Tensor]:
        if self.subclass is None:
            return [plain_view(t)]
        return [getattr(t, n) for n in self.inner_names]

    # -- building forms around a buffer ------------------------------------------------
    def build(self, buf: torch.Tensor) -> torch.Tensor:
        """A tensor of this entry's kind whose data are views into ``buf``."""
        return self.around([p.view(buf) for p in self.parts])

    def around(self, views: list[torch.Tensor]) -> torch.Tensor:
        """A tensor of this entry's kind around ``views``, one per part (its inner tensors)."""
        if self.subclass is None:
            return views[0]
        inner = dict(zip(self.inner_names, views))
        rebuilt = self.subclass.__tensor_unflatten__(  # type: ignore[attr-defined]
            inner, self.ctx, self.outer_size, self.outer_stride
        )
        if self.is_param:
            return nn.Parameter(rebuilt, requires_grad=self.requires_grad)
        return rebuilt

    def fill(self, buf: torch.Tensor, src: torch.Tensor) -> None:
        """Copies ``src``'s bytes into this entry's place in ``buf``."""
        for part, inner in zip(self.parts, self.inner_tensors(src)):
            part.view(buf).copy_(inner)

    # -- pointing the module at a form -------------------------------------------------
    def point_at(self, form: torch.Tensor) -> None:
        """Makes the module's tensor use ``form``'s data, keeping the same object.

        Plain tensors: ``.data =`` (cheap, keeps the object). Subclasses: swap_tensors,
        which exchanges the two objects' contents, so ``form`` afterwards holds the old one.
        """
        cur = self.current()
        if self.subclass is None:
            cur.data = form
        else:
            torch.utils.swap_tensors(cur, form)

    def hold(self, t: torch.Tensor) -> None:
        """Puts ``t`` back in the module's place where something else took it."""
        table: dict[str, Any] = self.module._parameters if self.is_param else self.module._buffers
        if table[self.attr] is not t:
            table[self.attr] = t

    def put(self, form: torch.Tensor) -> None:
        """Makes the module hold ``form`` as a new tensor object: for a tensor on the meta
        device, which cannot take real data (``.data =`` refuses it)."""
        table = self.module._parameters if self.is_param else self.module._buffers
        put_tensor(table, self.attr, self.is_param, form, self.requires_grad)


def put_tensor(
    table: dict[str, Any], attr: str, is_param: bool, value: torch.Tensor, requires_grad: bool
) -> None:
    """``value`` in a module's parameter or buffer table, as a new Parameter for a parameter."""
    if is_param:
        grad = requires_grad and value.dtype.is_floating_point
        table[attr] = nn.Parameter(value, requires_grad=grad)
    else:
        table[attr] = value


def make_entry(module: nn.Module, attr: str, qualname: str, is_param: bool, offset: int) -> Entry:
    table = module._parameters if is_param else module._buffers
    t = table[attr]
    assert t is not None
    why = unsupported_why(t)
    if why is not None:
        raise UnsupportedTensorError(qualname, type(t).__name__, why)
    subclass: type | None = None
    ctx: Any = None
    names: tuple[str, ...] = ()
    if is_traceable_wrapper_subclass(t):
        names_list, ctx = t.__tensor_flatten__()  # type: ignore[attr-defined]
        names = tuple(names_list)
        subclass = type(t)
        inner = [getattr(t, n) for n in names]
        if any(is_traceable_wrapper_subclass(i) for i in inner):
            raise FerryError(
                f"{qualname}: nested tensor subclasses ({subclass.__name__} inside another) "
                "cannot be offloaded; keep this layer resident or quantize it differently"
            )
    else:
        inner = [plain_view(t)]
    parts = []
    for i in inner:
        offset = align_up(offset)
        nbytes = tensor_nbytes(i)
        stride = _dense_stride(i)
        parts.append(Part(offset, nbytes, i.dtype, tuple(i.size()), stride))
        offset += nbytes
    return Entry(
        module=module,
        attr=attr,
        qualname=qualname,
        is_param=is_param,
        parts=tuple(parts),
        inner_names=names,
        subclass=subclass,
        ctx=ctx,
        outer_size=tuple(t.size()),
        outer_stride=tuple(t.stride()),
        requires_grad=bool(t.requires_grad),
        orig_device=t.device,
    )


def entry_end(entry: Entry) -> int:
    last = entry.parts[-1] if entry.parts else None
    return 0 if last is None else last.offset + last.nbytes
