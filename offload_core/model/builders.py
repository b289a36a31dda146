"""Model factories the CLI and the benchmark name: "demo" (shape read from the checkpoint)
or "package.module:function" (an importable ``build(device) -> nn.Module``)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable

import torch
from torch import nn

from ..errors import ConfigError
from ..formats.safetensors import Header

Build = Callable[[torch.device], nn.Module]


def demo_build(header: Header) -> Build:
    """A factory for offload_core.model.demo.DemoDiT with the sizes its checkpoint has."""
    from .demo import DemoDiT

    try:
        dim, in_channels = header.entries["img_in.weight"].shape
        dtype = header.entries["img_in.weight"].dtype
    except KeyError:
        raise ConfigError(
            "build", f"{header.path} is not a demo-model checkpoint (no img_in.weight)"
        ) from None

    def count(prefix: str) -> int:
        found = {
            int(m.group(1)) for k in header.entries if (m := re.match(rf"{prefix}\.(\d+)\.", k))
        }
        return max(found) + 1 if found else 0

    n_double, n_single = count("double_blocks"), count("single_blocks")

    def build(device: torch.device) -> nn.Module:
        with torch.device(device):
            model = DemoDiT(dim, max(dim // 64, 1), n_double, n_single, in_channels)
        return model.to(dtype).eval().requires_grad_(False)

    return build


def import_build(spec: str) -> Build:
    """ "package.module:function" -> the function (imported, never evaluated)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError("build", f"{spec!r}: write it as package.module:function, or 'demo'")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError("build", f"cannot import {spec!r}: {e}") from None
    if not callable(fn):
        raise ConfigError("build", f"{spec!r} is not callable")
    return fn  # type: ignore[no-any-return]
