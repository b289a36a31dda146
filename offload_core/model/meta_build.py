"""A network whose weights wait in their checkpoint: built by its host's own constructor, with
every tensor the checkpoint holds on the meta device (no bytes) until it is read from the file.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)
META = torch.device("meta")


def build_on_meta(build: Callable[[torch.device | None], M], stored: Container[str]) -> M:
    """``build(device)`` on the meta device; ``stored``: the state-dict names the checkpoint
    holds."""
    return build(META)
