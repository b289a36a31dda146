"""What a network's tensors cost as the host holds them: the one table the planner sizes every
network by, from a file's header alone (network_file.py) or from a network already in memory
(network_module.py).

[Note: held, not stored, not cast] A host casts a file's plain floats to the dtype it computes
in (core on a CPU loads bf16 as float32), but keeps every quantized format as stored and
dequantizes one layer at a time while it computes: legacy ``fp8_scaled`` and ``comfy_quant``
layers through core's ops, GGUF blocks through ComfyUI-GGUF's, a torchao preset's Linears
through torchao's. Counting those in the compute dtype (what the planner did before) made a
2.84 GB fp8_scaled Wan 10.48 GiB on a CPU and a 14 GB fp8 expert 28 GB on a bf16 GPU host.
What a quantized layer does cost beside its stored bytes is its dequantized copy while it
computes: one layer at a time, so a group's transient is its largest layer's copy and the
network's peak is its largest layer's (``HeldSizes.transient``).
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..formats.gguf import BLOCKS, TYPED
from ..formats.header import StoredTensor
from ..model.layout import tensor_nbytes

Format = Literal["float", "fp8", "fp8_scaled", "comfy_quant", "gguf", "torchao", "other"]
How = Literal["cast", "stored", "preset"]

#: The table: each stored format, and how the host holds a tensor of it.
HOLDS: dict[Format, How] = {
    # fp32 / fp16 / bf16 / fp64 outside any quantized layer: the host's compute dtype.
    "float": "cast",
    # float8_e4m3fn / e5m2 outside a quantized format: kept (cast per use) by a host that
    # computes wider in a fixed dtype; converted where the cast is itself 8-bit (a
    # weight_dtype widget) or is the host's own rule (core builds its network in unet_dtype
    # and copies every weight into it, keeping fp8 only where that rule says fp8).
    "fp8": "stored",
    # legacy: a ``scaled_fp8`` marker, ``<layer>.scale_weight`` / ``<layer>.scale_input``.
    "fp8_scaled": "stored",
    # ``<layer>.comfy_quant`` / ``weight_scale`` / ``_quantization_metadata``: fp8, MXFP8,
    # NVFP4, int8 layers with their scales.
    "comfy_quant": "stored",
    # a .gguf's tensors, quantized blocks and F16/F32 alike: ComfyUI-GGUF maps them as stored.
    "gguf": "stored",
    # a Linear a torchao preset quantizes as it is read: ``PRESET_BYTES``.
    "torchao": "preset",
    # integers, bools, anything else: as stored.
    "other": "stored",
}

#: torchao 0.18's bytes for an (out, in) weight, by preset (quant/presets.py's names; the
#: planner sits beside quant/, not above it, so the figures are kept here and
#: tests/test_stored_sizes.py holds them to quant/'s presets): int8 qdata with a float32 scale
#: and an int8 zero point per row; float8 qdata with a float32 scale per row (the CPU presets,
#: measured against torchao by that test); int4 packed two a byte with a bf16 scale and zero
#: point per 128 values (Int4Tensor); float8-dynamic's one per-tensor scale. With each, the
#: in_features multiple its kernel takes (``Preset.in_features_multiple``).
PRESET_BYTES: dict[str, tuple[Callable[[int, int], int], int]] = {
    "int8-weight": (lambda o, i: o * i + 5 * o, 1),
    "int8-dynamic": (lambda o, i: o * i + 5 * o, 1),
    "float8-weight": (lambda o, i: o * i + 4 * o, 1),
    "int4-weight": (lambda o, i: o * i // 2 + 2 * 2 * o * (i // 128), 128),
    "float8-dynamic": (lambda o, i: o * i + 4, 16),
}
#: quant/selection.py's defaults: what a preset leaves in full precision.
SKIP_PATTERNS: tuple[str, ...] = ("*norm*", "*embed*")
MIN_WEIGHT_NUMEL = 128 * 128

#: A quantized layer's own tensors, as core's loaders name them (comfy/utils.py
#: convert_old_quants, comfy/quant_ops.py QUANT_ALGOS' parameters).
_QUANT_SUFFIXES = (
    ".scale_weight", ".scale_input", ".weight_scale", ".weight_scale_2", ".input_scale",
    ".pre_quant_scale", ".comfy_quant",
)  # fmt: skip
#: Core's own quantized formats (a host that predates one loads its files as plain floats).
CORE_FORMATS: tuple[Format, ...] = ("fp8_scaled", "comfy_quant")
Cast = torch.dtype | Callable[[torch.dtype, int], "torch.dtype | None"] | None


@dataclass(frozen=True)
class HeldTensor:
    format: Format
    nbytes: int  # as the host holds it
    verbatim: bool  # held as stored: the disk tier can read it from the file
    dequant_bytes: int  # its copy in the compute dtype while its layer computes (0: none)


@dataclass(frozen=True)
class HeldSizes:
    tensors: dict[str, HeldTensor]
    compute: torch.dtype

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def verbatim(self) -> bool:
        return all(t.verbatim for t in self.tensors.values())

    @property
    def transient(self) -> int:
        """The largest layer's dequantized copy: one layer computes at a time."""
        layers: dict[str, int] = {}
        for key, t in self.tensors.items():
            if t.dequant_bytes:
                layer = key.rpartition(".")[0]
                layers[layer] = layers.get(layer, 0) + t.dequant_bytes
        return max(layers.values(), default=0)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def file_format(keys: Collection[str], metadata: Mapping[str, str], gguf: bool) -> Format:
    """The file's quantized format, as core's loaders tell it (nodes/stream_loader.py
    ``core_quant_format``), or "float" where it has none."""
    if gguf:
        return "gguf"
    if "_quantization_metadata" in metadata:
        return "comfy_quant"
    if any(k == "scaled_fp8" or k.endswith(".scaled_fp8") for k in keys):
        return "fp8_scaled"
    return "comfy_quant" if any(k.endswith(_QUANT_SUFFIXES) for k in keys) else "float"


def quantized_layers(
    keys: Collection[str], metadata: Mapping[str, str], prefix: str = ""
) -> set[str]:
    """The layers core loads quantized: each one with a scale or config tensor, or listed in
    the header's ``_quantization_metadata`` (by its key in the file: ``prefix`` is taken off,
    as it is off ``keys``)."""
    out = {k[: k.rindex(".")] for k in keys if k.endswith(_QUANT_SUFFIXES)}
    try:
        listed = json.loads(metadata.get("_quantization_metadata", "{}")).get("layers", {})
    except (ValueError, AttributeError):
        listed = {}
    return out | {str(layer).removeprefix(prefix) for layer in listed}


def _preset_takes(key: str, t: StoredTensor, preset: str, blocks: Collection[str]) -> bool:
    """Whether ``preset`` quantizes the weight ``key``, as quant/selection.py's defaults choose
    from the module (a header has no modules: a 2-D weight is a Linear's, and a block
    list's members are the blocks'): a float16/bfloat16/float32 Linear inside the blocks, not
    a norm or an embedding, big enough, its in_features a multiple the kernel takes."""
    if preset not in PRESET_BYTES or not key.endswith(".weight") or len(t.shape) != 2:
        return False
    if not t.dtype.is_floating_point or t.dtype.itemsize < 2:
        return False
    layer = key[: -len(".weight")]
    if any(fnmatch.fnmatchcase(layer.lower(), pat) for pat in SKIP_PATTERNS):
        return False
    if not any(layer.startswith(b + ".") for b in blocks):
        return False
    out, inp = t.shape
    return out * inp >= MIN_WEIGHT_NUMEL and inp % PRESET_BYTES[preset][1] == 0


def _values(t: StoredTensor) -> int:
    """How many values a stored tensor holds once dequantized: a GGUF block type's values
    per block, a packed 4-bit (uint8-stored) comfy_quant weight's two a byte."""
    if t.ggml_type is not None and t.ggml_type not in TYPED:
        per_block, block_bytes = BLOCKS[t.ggml_type]
        return t.nbytes // block_bytes * per_block
    if t.dtype == torch.uint8:
        return 2 * _numel(t.shape)
    return _numel(t.shape)


def _main_plain(entries: Mapping[str, StoredTensor], plain: Collection[str]) -> torch.dtype | None:
    by_dtype: dict[torch.dtype, int] = {}
    for k in plain:
        t = entries[k]
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
    return max(by_dtype, key=lambda d: by_dtype[d], default=None)


def formats(
    entries: Mapping[str, StoredTensor],
    metadata: Mapping[str, str],
    *,
    gguf: bool = False,
    preset: str | None = None,
    blocks: Collection[str] = (),
    prefix: str = "",
    keeps: Collection[str] = CORE_FORMATS,
) -> dict[str, Format]:
    """Each tensor's stored format: the table's row it is held by. ``keeps``: core's
    quantized formats the host loads as such; a file in another is plain floats to it."""
    fmt = file_format(entries, metadata, gguf)
    quant = set()
    if fmt in ("fp8_scaled", "comfy_quant") and fmt in keeps:
        quant = quantized_layers(entries, metadata, prefix)
    kinds: dict[str, Format] = {}
    for key, t in entries.items():
        layer, _, leaf = key.rpartition(".")
        if fmt == "gguf":
            kinds[key] = "gguf"
        elif (layer in quant and leaf != "bias") or key.endswith("scaled_fp8"):
            kinds[key] = fmt
        elif preset and _preset_takes(key, t, preset, blocks):
            kinds[key] = "torchao"
        elif not t.dtype.is_floating_point:
            kinds[key] = "other"
        else:
            kinds[key] = "fp8" if t.dtype.itemsize == 1 else "float"
    return kinds


def _casts(
    entries: Mapping[str, StoredTensor], kinds: Mapping[str, Format], cast: Cast
) -> tuple[torch.dtype | None, torch.dtype | None, torch.dtype]:
    """(plain floats' dtype, plain fp8's dtype, compute dtype) as the host's ``cast`` says; a
    None dtype: kept as stored."""
    plain = [k for k, f in kinds.items() if f in ("float", "fp8")]
    main = _main_plain(entries, plain)
    ruled = callable(cast)
    if callable(cast):
        # A file with no plain floats (a GGUF's) still asks: the answer is its compute dtype.
        floats = [k for k, t in entries.items() if t.dtype.is_floating_point]
        asked = main or _main_plain(entries, floats)
        params = sum(_numel(t.shape) for t in entries.values())
        cast = cast(asked, params) if asked is not None else None
    # A host converts plain fp8 where the cast is 8-bit itself, or where its own rule chose
    # the dtype (core builds the network in unet_dtype and copies every weight into it: it
    # keeps a plain fp8 file in fp8 only where its rule says fp8); a host computing wider in
    # a fixed dtype keeps fp8 storage and casts per use.
    fp8_to = cast if cast is not None and (cast.itemsize == 1 or ruled) else None
    compute = next(
        (d for d in (cast, main) if d is not None and d.is_floating_point and d.itemsize >= 2),
        torch.float32,  # nothing says: a CPU's compute dtype, the larger copy
    )
    return cast, fp8_to, compute


def held_sizes(
    entries: Mapping[str, StoredTensor],
    metadata: Mapping[str, str],
    *,
    gguf: bool = False,
    cast: Cast = None,
    preset: str | None = None,
    blocks: Collection[str] = (),
    prefix: str = "",
    keeps: Collection[str] = CORE_FORMATS,
) -> HeldSizes:
    """Each tensor of ``entries`` as the host holds it (the Note; ``HOLDS``). ``cast``: the
    dtype the host loads plain floats in, None (as stored), or the host's rule of the file's
    main plain-float dtype and its parameter count (core's ``unet_dtype`` takes both).
    ``preset``: a torchao preset the loader quantizes the Linears inside ``blocks`` (block
    list key prefixes) with. ``prefix``: what was taken off the file's keys to give
    ``entries``' (a checkpoint's network). ``keeps``: core's quantized formats the host
    loads as such (v0.3.64 has no comfy_quant: it loads such a file as plain floats). Reads
    nothing: the header's keys, dtypes, shapes."""
    kinds = formats(
        entries, metadata, gguf=gguf, preset=preset, blocks=blocks, prefix=prefix, keeps=keeps
    )
    float_to, fp8_to, compute = _casts(entries, kinds, cast)
    out = {}
    for key, t in entries.items():
        kind = kinds[key]
        to = float_to if kind == "float" else fp8_to if kind == "fp8" else None
        if HOLDS[kind] == "preset":
            nbytes = PRESET_BYTES[preset][0](*t.shape)  # type: ignore[index]
        elif to is not None:
            nbytes = _numel(t.shape) * to.itemsize
        else:
            nbytes = t.nbytes
        held = to or t.dtype
        quantized = kind in ("fp8_scaled", "comfy_quant", "torchao") or (
            kind == "gguf" and t.ggml_type not in TYPED
        )
        weight = (quantized and key.endswith(".weight")) or (kind == "fp8" and held.itemsize == 1)
        out[key] = HeldTensor(
            format=kind,
            nbytes=nbytes,
            verbatim=HOLDS[kind] != "preset" and to in (None, t.dtype),
            dequant_bytes=_values(t) * compute.itemsize if weight else 0,
        )
    return HeldSizes(out, compute)


def held_tensor(t: torch.Tensor, compute: torch.dtype | None = None) -> HeldTensor:
    """A tensor already in memory, by the same table: its bytes as held (a torchao or core
    quantized tensor by its inner tensors, a GGUF tensor by its raw bytes: model/layout.py's
    ``tensor_nbytes``), and its dequantized copy's in ``compute`` (None: the dtype a quantized
    wrapper says it computes in, else float32) where it is held quantized."""
    nbytes = tensor_nbytes(t)
    shape = getattr(t, "tensor_shape", None)  # ComfyUI-GGUF's weights: the dequantized shape
    if is_traceable_wrapper_subclass(t):
        dtype = compute or t.dtype
        return HeldTensor("comfy_quant", nbytes, True, t.numel() * dtype.itemsize)
    if shape is not None and int(getattr(t, "tensor_type", -1)) not in TYPED:
        dtype = compute or torch.float32
        return HeldTensor("gguf", nbytes, True, _numel(tuple(shape)) * dtype.itemsize)
    if t.dtype.is_floating_point and t.dtype.itemsize == 1:
        dtype = compute or torch.float32
        return HeldTensor("fp8", nbytes, True, t.numel() * dtype.itemsize)
    return HeldTensor("float" if t.dtype.is_floating_point else "other", nbytes, True, 0)
