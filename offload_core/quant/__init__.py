"""Ferry's quantization loader: torchao presets, quantize-on-load and a quantized cache.

    from offload_core.quant import load_quantized, presets_for_device

    model, report = load_quantized("flux.safetensors", build, "int8-weight", cache_dir="~/.cache/ferry")
    print(report.describe())  # per layer: quantized or why kept, bytes before/after

Importing this package does not import torchao (that happens when a preset is used).
"""

from .loader import load_quantized
from .presets import PRESETS, Preset, presets_for_device, resolve_preset
from .quantize import quantize_model
from .report import LayerReport, QuantReport
from .selection import DEFAULT_MIN_WEIGHT_NUMEL, DEFAULT_SKIP_PATTERNS, SkipRules

__all__ = [
    "DEFAULT_MIN_WEIGHT_NUMEL",
    "DEFAULT_SKIP_PATTERNS",
    "PRESETS",
    "LayerReport",
    "Preset",
    "QuantReport",
    "SkipRules",
    "load_quantized",
    "presets_for_device",
    "quantize_model",
    "resolve_preset",
]
