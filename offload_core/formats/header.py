"""What a checkpoint's index is, whatever its format: each tensor's key, dtype, shape and
byte range in the file (safetensors.py and gguf.py each parse their format into it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StoredTensor:
    """One tensor in a file: where its bytes are (absolute file offsets)."""

    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int
    #: A GGUF tensor's GGML type (gguf.py's BLOCKS: values and bytes per block); None for a
    #: safetensors tensor, whose dtype says it all.
    ggml_type: int | None = None

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Header:
    path: str
    entries: dict[str, StoredTensor]
    metadata: dict[str, str]
    raw: bytes  # the header bytes as stored (hashed into the cache key)
    file_size: int


class HeaderError(ValueError):
    """The file is not a well-formed checkpoint of its format (safetensors, GGUF)."""
