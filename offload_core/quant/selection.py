"""Which layers to quantize, and why each other one is left alone.

Default: the nn.Linear layers inside the model's blocks (the children of its nn.ModuleLists),
which hold nearly all the weights of a transformer. Left in full precision by default: norms
and embeddings (not Linear, or named so), the first and last projection (outside the blocks;
they are few bytes and errors there reach every token), and layers too small to gain. A user
overrides by name pattern.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from ..errors import ConfigError
from ..model.layout import tensor_nbytes
from .presets import Preset

SETTING = "quant_skip"

# fnmatch patterns on a module's qualified name (e.g. "blocks.3.attn.qkv"), case-insensitive.
DEFAULT_SKIP_PATTERNS: tuple[str, ...] = ("*norm*", "*embed*")
# 128 x 128 weights: such a layer saves at most 48 KiB (fp32 -> int8), not worth a quantized
# kernel call's overhead and its rounding error (a judgement call; SkipRules overrides it).
DEFAULT_MIN_WEIGHT_NUMEL = 128 * 128


@dataclass(frozen=True)
class SkipRules:
    """What to leave in full precision.

    patterns: skip a Linear whose name matches one of these (fnmatch).
    force: quantize a Linear whose name matches one of these, even where a pattern, the
        blocks-only rule or the size rule would skip it (never where the kernel cannot).
    min_weight_numel: skip a Linear with fewer weights than this.
    blocks_only: only Linears inside the model's blocks (nn.ModuleList children); a model
        with no nn.ModuleList falls back to every Linear but its first and last.
    """

    patterns: tuple[str, ...] = DEFAULT_SKIP_PATTERNS
    force: tuple[str, ...] = ()
    min_weight_numel: int = DEFAULT_MIN_WEIGHT_NUMEL
    blocks_only: bool = True

    @classmethod
    def from_user(cls, skip: SkipRules | Sequence[str] | str | None) -> SkipRules:
        """None: the defaults. A list of patterns (or one comma-separated string) is added to
        the default patterns; a pattern starting with "!" forces quantization instead."""
        if skip is None:
            return cls()
        if isinstance(skip, SkipRules):
            skip.validate()
            return skip
        if isinstance(skip, str):
            skip = [s for s in (part.strip() for part in skip.split(",")) if s]
        if not all(isinstance(s, str) and s.strip("!") for s in skip):
            raise ConfigError(
                SETTING, f"must be a list of name patterns like '*.proj_out', got {skip!r}"
            )
        extra = tuple(s for s in skip if not s.startswith("!"))
        force = tuple(s[1:] for s in skip if s.startswith("!"))
        rules = cls(patterns=DEFAULT_SKIP_PATTERNS + extra, force=force)
        rules.validate()
        return rules

    def validate(self) -> None:
        n = self.min_weight_numel
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(SETTING, f"min_weight_numel must be a whole number >= 0, got {n!r}")

    def to_json(self) -> str:
        """Canonical form (part of the cache key)."""
        return json.dumps(asdict(self), sort_keys=True)


@dataclass
class LayerChoice:
    """The decision for one module that owns tensors."""

    name: str
    module: nn.Module = field(repr=False)
    quantize: bool
    reason: str  # why skipped, or "" when quantized


def _linear_names_in_blocks(model: nn.Module) -> set[str] | None:
    names: set[str] = set()
    found = False
    for prefix, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList):
            found = True
            for sub, child in mod.named_modules(prefix=prefix):
                if isinstance(child, nn.Linear) and sub != prefix:
                    names.add(sub)
    return names if found else None


def choose_layers(model: nn.Module, preset: Preset, rules: SkipRules) -> list[LayerChoice]:
    """A decision for every module that directly owns a parameter or buffer, in model order."""
    rules.validate()
    owners = [
        (name, mod)
        for name, mod in model.named_modules()
        if any(t is not None for t in (*mod._parameters.values(), *mod._buffers.values()))
    ]
    linears = [name for name, mod in owners if isinstance(mod, nn.Linear)]
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    shared = {id(p) for p in model.parameters() if counts[id(p)] > 1}
    in_blocks = _linear_names_in_blocks(model)
    ends = {linears[0]: "first projection", linears[-1]: "last projection"} if linears else {}
    choices = []
    for name, mod in owners:
        if isinstance(mod, nn.Linear) and id(mod.weight) in shared and preset.quantizes:
            # A tied weight (e.g. an output head sharing an embedding's) is used by a module
            # that cannot take a quantized tensor, or would be quantized twice.
            choices.append(LayerChoice(name, mod, False, "weight shared with another layer"))
            continue
        choices.append(LayerChoice(name, mod, *_decide(name, mod, preset, rules, in_blocks, ends)))
    return choices


def _decide(
    name: str,
    mod: nn.Module,
    preset: Preset,
    rules: SkipRules,
    in_blocks: set[str] | None,
    ends: dict[str, str],
) -> tuple[bool, str]:
    if not isinstance(mod, nn.Linear):
        return False, f"not a Linear ({type(mod).__name__})"
    if not preset.quantizes:
        return False, "preset none"
    weight = mod.weight
    if is_quantized(weight):
        return False, f"already quantized ({type(weight).__name__})"
    if not weight.dtype.is_floating_point or weight.dtype.itemsize < 2:
        return False, f"weight dtype {weight.dtype} is not a float16/bfloat16/float32"
    if mod.in_features % preset.in_features_multiple:
        return (
            False,
            f"in_features {mod.in_features} is not a multiple of {preset.in_features_multiple}",
        )
    if any(_match(name, p) for p in rules.force):
        return True, ""
    pattern = next((p for p in rules.patterns if _match(name, p)), None)
    if pattern is not None:
        return False, f"matches skip pattern {pattern!r}"
    if rules.blocks_only:
        if in_blocks is not None and name not in in_blocks:
            return False, "outside the blocks"
        if in_blocks is None and name in ends:
            return False, ends[name]
    if weight.numel() < rules.min_weight_numel:
        return False, f"too small ({weight.numel()} weights < {rules.min_weight_numel})"
    return True, ""


DECLINED = "left in full precision by torchao (a shape or dtype its kernel declines)"


def _match(name: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(name.lower(), pattern.lower())


def is_quantized(t: torch.Tensor | None) -> bool:
    """A torchao tensor subclass (its data lives in inner tensors such as qdata and scale)."""
    return t is not None and hasattr(t, "__tensor_flatten__")


def module_bytes(mod: nn.Module) -> int:
    """Bytes of the tensors a module owns directly (not its children's)."""
    return sum(
        tensor_nbytes(t)
        for t in (*mod._parameters.values(), *mod._buffers.values())
        if t is not None
    )
