"""What an offloaded network is in its pipeline: a diffusion model, a text encoder, a
ControlNet, a model patch (Qwen-Image's block-wise ControlNet, ...) or a CLIP vision encoder.

offload_core moves every kind the same way; the kind is for people. A graph that offloads
both its diffusion model and its text encoder shows two lines in the sidebar, the panel and
the memory report, and each line says which it is ("text encoder: clip_l + t5xxl") from the
kind the host gave ``apply_offload``, never from the network's class name.
"""

from __future__ import annotations

from enum import Enum

from .errors import ConfigError


class OffloadKind(str, Enum):
    MODEL = "model"
    TEXT_ENCODER = "text_encoder"
    CONTROLNET = "controlnet"
    MODEL_PATCH = "model_patch"
    CLIP_VISION = "clip_vision"

    @property
    def label(self) -> str:
        """The words a line starts with."""
        return _LABELS[self]

    def line_title(self, name: str) -> str:
        """The line's title: ``text encoder: t5xxl``."""
        return f"{self.label}: {name}"


_LABELS = {
    OffloadKind.MODEL: "model",
    OffloadKind.TEXT_ENCODER: "text encoder",
    OffloadKind.CONTROLNET: "ControlNet",
    OffloadKind.MODEL_PATCH: "model patch",
    OffloadKind.CLIP_VISION: "CLIP vision",
}

#: The order lines are listed in: the diffusion model's first, then the text encoders', then
#: the networks beside them.
LISTING_ORDER = {kind: i for i, kind in enumerate(OffloadKind)}


def parse_kind(value: object) -> OffloadKind:
    """An ``OffloadKind`` or its value ("model", "text_encoder"); anything else is refused by
    name, before any weight moves."""
    try:
        return OffloadKind(value)
    except ValueError:
        choices = ", ".join(repr(k.value) for k in OffloadKind)
        raise ConfigError("kind", f"must be one of {choices}, got {value!r}") from None
