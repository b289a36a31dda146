"""The quantized cache: one torchao-format safetensors file per (checkpoint, preset, skip list).

An entry is never trusted on its name alone. Its header carries the full key (the checkpoint's
size, mtime and header hash; preset; skip rules; device type; the model's tensor signature;
torchao's version), a CRC32 of every tensor and a CRC32 of the header itself. A key mismatch
is "stale", any other mismatch or unreadable byte is "corrupt"; both are rebuilt. Writes go to
a temporary file in the same folder, are fsynced and renamed over the entry (disk/durable.py's
atomic_write), so a reader sees either the old entry or the complete new one; a failed write
(disk full) removes its temporary file and the load still returns the model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
from torch import nn

from ..disk.durable import atomic_write
from ..disk.files import files
from ..disk.reader import read_stored_new
from ..errors import ConfigError
from ..formats.safetensors import Header, HeaderError, byte_view, read_header, write_file
from ..runtime.memory import trim_heap
from .model_tensors import model_signature, module_tensors, place, restore, snapshot
from .presets import Preset
from .report import LayerReport, QuantReport
from .selection import LayerChoice, SkipRules
from .streaming import Progress

FORMAT = 1
SPARE_BYTES = 64 << 20  # left free on the cache's disk after a write
log = logging.getLogger("ferry.quant")


class CorruptEntry(Exception):
    """A cache entry's bytes do not match its checksums."""


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    key_json: str


def check_cache_dir(cache_dir: str | os.PathLike[str]) -> Path:
    """Creates the folder if needed; ConfigError("cache_dir") when it cannot be used."""
    path = Path(cache_dir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError("cache_dir", f"cannot create {str(path)!r}: {e.strerror or e}") from None
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(
            "cache_dir", f"{str(path)!r} is not a writable folder; pick another cache_dir"
        )
    return path


def entry_for(
    cache_dir: Path,
    header: Header,
    preset: Preset,
    rules: SkipRules,
    device: torch.device,
    model: nn.Module,
) -> CacheEntry:
    """The entry's file (one per checkpoint path, preset, skip rules, device type and model
    layout, so a changed checkpoint overwrites its stale entry instead of piling up) and key."""
    import torchao

    ckpt = os.path.abspath(header.path)
    st = os.stat(ckpt)
    signature = model_signature(model)
    slot = json.dumps([ckpt, preset.name, rules.to_json(), device.type, signature])
    slot_hash = hashlib.sha256(slot.encode()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(ckpt).stem)[:48]
    key = {
        "format": FORMAT,
        "torchao": torchao.__version__,
        "checkpoint": {
            "path": ckpt,
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "header_sha256": hashlib.sha256(header.raw).hexdigest(),
        },
        "preset": preset.name,
        "skip": rules.to_json(),
        "device": device.type,
        "model": signature,
    }
    name = f"{stem}-{preset.name}-{slot_hash}.safetensors"
    return CacheEntry(cache_dir / name, json.dumps(key, sort_keys=True))


def _crc(t: torch.Tensor) -> int:
    return zlib.crc32(byte_view(t))


def _header_check(specs: list[tuple[str, str, list[int]]], metadata: dict[str, str]) -> str:
    body = {k: v for k, v in metadata.items() if k != "ferry.check"}
    return str(zlib.crc32(json.dumps([specs, body], sort_keys=True).encode()))


def _data_keys(meta_json: str, name: str, header: Header) -> list[str]:
    """The file keys holding tensor ``name`` in torchao's flattened layout."""
    info = json.loads(meta_json)
    if info.get("_type") == "Tensor":
        return [name]
    fqn, attr = name.rsplit(".", 1)
    keys = [f"{fqn}._{attr}_{n}" for n in info["_tensor_data_names"]]
    return [k for k in keys if k in header.entries]


def load(
    entry: CacheEntry,
    model: nn.Module,
    choices: list[LayerChoice],
    device: torch.device,
    progress: Progress | None = None,
) -> tuple[str, list[LayerReport] | None]:
    """Fills the meta model from the entry: ("hit", layers), or ("miss"|"stale"|"corrupt", None)
    with the model left untouched."""
    if not entry.path.exists():
        return "miss", None
    saved = snapshot(model)
    try:
        header = read_header(entry.path)
        md = header.metadata
        if md.get("ferry.key") != entry.key_json:
            return "stale", None
        specs = [
            (e.key, str(e.dtype), list(e.shape))
            for e in sorted(header.entries.values(), key=lambda e: e.start)
        ]
        if md.get("ferry.check") != _header_check(specs, md):
            raise CorruptEntry("its header fails its checksum")
        crcs = json.loads(md["ferry.crc32"])
        layers = QuantReport.layers_from_json(md["ferry.layers"])
        _fill(entry, header, crcs, choices, device, progress)
    except (CorruptEntry, HeaderError, OSError, KeyError, TypeError, ValueError) as e:
        # ValueError covers JSON and torchao's own rebuild errors; nothing read is kept.
        restore(model, saved)
        log.warning("ferry: cache entry %s is corrupt (%s); rebuilding it", entry.path, e)
        return "corrupt", None
    return "hit", layers


def _fill(
    entry: CacheEntry,
    header: Header,
    crcs: dict[str, int],
    choices: list[LayerChoice],
    device: torch.device,
    progress: Progress | None,
) -> None:
    from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

    md = header.metadata
    placed: dict[int, torch.Tensor] = {}  # meta tensor id -> loaded tensor: ties stay tied
    keep_alive: list[torch.Tensor] = []  # so a freed meta tensor's id is never reused
    # The disk tier's reads (disk/reader.py), through the platform's calls (disk/files.py).
    backend = files()
    fd = backend.open(entry.path)
    try:
        for i, c in enumerate(choices):
            slots = []
            for s in module_tensors(c.name, c.module):
                if not s.persistent:
                    continue
                if id(s.get()) in placed:
                    s.module._parameters[s.attr] = placed[id(s.get())]  # type: ignore[assignment]
                else:
                    slots.append(s)
            data: dict[str, torch.Tensor] = {}
            for s in slots:
                for k in _data_keys(md[s.key], s.key, header):
                    t = read_stored_new(backend, fd, header.entries[k])
                    if t is None:
                        raise HeaderError(f"{entry.path}: ended inside tensor {k!r}")
                    if _crc(t) != crcs[k]:
                        raise CorruptEntry(f"tensor {k} fails its checksum")
                    data[k] = t
            sub = {s.key: md[s.key] for s in slots}
            sub["tensor_names"] = json.dumps([s.key for s in slots])
            tensors, leftover = unflatten_tensor_state_dict(data, sub) if slots else ({}, {})
            if leftover or set(tensors) != {s.key for s in slots}:
                raise CorruptEntry(f"layer {c.name!r} does not rebuild from its tensors")
            for s in slots:
                meta = s.get()
                value = tensors[s.key]
                place(s, value.to(device), meta.requires_grad and type(value) is torch.Tensor)
                keep_alive.append(meta)
                placed[id(meta)] = s.get()
            if progress is not None:
                progress(i + 1, len(choices))
    finally:
        os.close(fd)


def _layer_state(c: LayerChoice) -> dict[str, torch.Tensor]:
    return {s.key: s.get().detach() for s in module_tensors(c.name, c.module) if s.persistent}


def _flattened(
    choices: list[LayerChoice],
) -> Iterator[tuple[dict[str, torch.Tensor], dict[str, str]]]:
    """torchao's flattened form, one layer at a time (it clones a layer's inner tensors)."""
    from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

    for c in choices:
        state = _layer_state(c)
        if state:
            tensors, metadata = flatten_tensor_state_dict(state)
            yield {k: v.detach().cpu().contiguous() for k, v in tensors.items()}, metadata


def _write_chunk(f: BinaryIO, view: memoryview) -> None:
    f.write(view)


def save(entry: CacheEntry, choices: list[LayerChoice], report: QuantReport) -> str:
    """Writes the entry atomically; returns "" or why it was not written (the load goes on)."""
    specs: list[tuple[str, torch.dtype, tuple[int, ...]]] = []
    crcs: dict[str, int] = {}
    metadata: dict[str, str] = {}
    names: list[str] = []
    for tensors, layer_md in _flattened(choices):
        for k, t in tensors.items():
            specs.append((k, t.dtype, tuple(t.shape)))
            crcs[k] = _crc(t)
        names += json.loads(layer_md.pop("tensor_names"))
        metadata.update(layer_md)
    metadata["tensor_names"] = json.dumps(names)
    metadata["ferry.key"] = entry.key_json
    metadata["ferry.crc32"] = json.dumps(crcs)
    metadata["ferry.layers"] = report.layers_json()
    metadata["ferry.check"] = _header_check([(k, str(d), list(s)) for k, d, s in specs], metadata)

    need = sum(_nbytes(d, s) for _, d, s in specs)
    folder = entry.path.parent
    free = shutil.disk_usage(folder).free
    if free < need + SPARE_BYTES:
        return f"write skipped: needs {need} bytes, {free} free in {folder}"
    try:
        with atomic_write(entry.path) as f:
            write_file(f, specs, metadata, _tensors_in_order(choices), write=_write_chunk)
    except OSError as e:
        log.warning("ferry: could not write cache entry %s: %s", entry.path, e)
        return f"write failed: {e.strerror or e}"
    finally:
        trim_heap()  # the per-layer clones torchao's flatten made
    return ""


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    n = dtype.itemsize
    for s in shape:
        n *= s
    return n


def _tensors_in_order(choices: list[LayerChoice]) -> Iterator[tuple[str, torch.Tensor]]:
    for tensors, _ in _flattened(choices):
        yield from tensors.items()
