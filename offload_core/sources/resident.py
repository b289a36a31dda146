"""A group kept on the onload device (a VRAM budget): never streamed, never loaded, so not a
source the engine sees; the placement holds its device buffer until remove."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..model.grouping import GroupSpec

if TYPE_CHECKING:
    from ..transfer.backend import Backend


class DeviceBytes:
    """The group's slab on the device (``HeldBytes``)."""

    file_plan = None  # its bytes are in memory: no file

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf = buf

    def host_bytes(self, nbytes: int) -> torch.Tensor:
        return self.buf

    def close(self, backend: Backend) -> None:
        pass


@dataclass
class ResidentGroup:
    """A group placed on the device for good: its spec and its buffer."""

    spec: GroupSpec
    source: DeviceBytes
    host_forms: list[torch.Tensor] = field(default_factory=list)  # none: it never leaves

    @property
    def name(self) -> str:
        return self.spec.name
