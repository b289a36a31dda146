"""Quantization presets: stable names a user picks, each mapped to one torchao 0.18 config.

A preset knows where it can run, so a wrong choice fails with a ConfigError naming the
presets that do run there, before any weight is read. torchao is imported only when a config
is built (never at import time: it is slow to import and optional for the offloader).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError

SETTING = "quant_preset"


@dataclass(frozen=True)
class Preset:
    """One named quantization scheme.

    ``in_features_multiple`` / ``out_features_multiple`` / ``weight_dtypes``: a Linear the
    kernel cannot take (group or tile size, dtype) is left in full precision, with the reason
    in the report. Where it runs is checked by ``unsupported_reason``.
    """

    name: str
    summary: str
    config_name: str | None  # the torchao config class; None for "none"
    device_types: tuple[str, ...]
    in_features_multiple: int = 1
    out_features_multiple: int = 1
    weight_dtypes: tuple[torch.dtype, ...] | None = None  # None: any float dtype
    min_cuda_capability: tuple[int, int] | None = None
    needs_module: str | None = None  # an extra kernel package the config imports at run time
    config_kwargs: Callable[[], dict[str, Any]] | None = None

    @property
    def quantizes(self) -> bool:
        return self.config_name is not None

    def unsupported_reason(self, device: torch.device | str) -> str | None:
        """Why this preset cannot run on ``device``, or None where it can.

        Reads the CUDA capability only for a CUDA device (that initialises CUDA, which the
        caller is about to use anyway).
        """
        dev = torch.device(device)
        if dev.type not in self.device_types:
            return f"{self.name} runs on {'/'.join(self.device_types)} only, not {dev.type}"
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                return f"{self.name} needs CUDA, and this torch build sees no CUDA device"
            if self.min_cuda_capability is not None:
                cap = torch.cuda.get_device_capability(dev)
                if tuple(cap) < self.min_cuda_capability:
                    want = ".".join(map(str, self.min_cuda_capability))
                    return f"{self.name} needs compute capability >= {want}, this GPU has {cap[0]}.{cap[1]}"
        if self.needs_module and importlib.util.find_spec(self.needs_module) is None:
            return f"{self.name} needs the {self.needs_module} package (pip install {self.needs_module})"
        if self.quantizes and importlib.util.find_spec("torchao") is None:
            return f"{self.name} needs torchao (pip install torchao==0.18.0)"
        return None

    def make_config(self) -> Any:
        """The torchao config object (imports torchao)."""
        if self.config_name is None:
            raise ConfigError(SETTING, "the 'none' preset has no torchao config")
        import torchao.quantization as tq

        cls = getattr(tq, self.config_name)
        return cls(**(self.config_kwargs() if self.config_kwargs else {}))


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("none", "full precision (no quantization)", None, ("cpu", "cuda", "mps", "xpu")),
        Preset(
            "int8-weight",
            "int8 weights, per-row scales; activations stay in the model's dtype",
            "Int8WeightOnlyConfig",
            ("cpu", "cuda"),
        ),
        Preset(
            "int8-dynamic",
            "int8 weights and int8 activations quantized on the fly (int8 matmul)",
            "Int8DynamicActivationInt8WeightConfig",
            ("cpu", "cuda"),
        ),
        Preset(
            "float8-weight",
            "float8 (e4m3) weights, per-row scales; activations stay in the model's dtype",
            "Float8WeightOnlyConfig",
            ("cpu", "cuda"),
        ),
        Preset(
            "int4-weight",
            "int4 weights in groups of 128 (CUDA kernels from mslk)",
            "Int4WeightOnlyConfig",
            ("cuda",),
            in_features_multiple=128,
            weight_dtypes=(torch.bfloat16,),
            needs_module="mslk",
        ),
        Preset(
            "float8-dynamic",
            "float8 weights and float8 activations (needs compute capability >= 8.9)",
            "Float8DynamicActivationFloat8WeightConfig",
            ("cuda",),
            in_features_multiple=16,
            out_features_multiple=16,
            min_cuda_capability=(8, 9),
        ),
    )
}
"""Every preset by its stable name (the nodes and the panel list these)."""


def presets_for_device(device: torch.device | str) -> list[str]:
    """The names of the presets that can run on ``device`` on this machine, "none" first."""
    return [name for name, p in PRESETS.items() if p.unsupported_reason(device) is None]


def resolve_preset(preset: str | Preset, device: torch.device | str) -> Preset:
    """The preset object for a name, checked against ``device``; ConfigError otherwise."""
    if isinstance(preset, Preset):
        p = preset
    else:
        if preset not in PRESETS:
            raise ConfigError(
                SETTING, f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}"
            )
        p = PRESETS[preset]
    reason = p.unsupported_reason(device)
    if reason is not None:
        can = ", ".join(presets_for_device(device))
        raise ConfigError(SETTING, f"{reason}. Presets that run on {device} here: {can}")
    return p
