"""The one table of network kinds: what a network is in its pipeline (a diffusion model, a text
encoder, a ControlNet, a model patch, a CLIP vision encoder, a VAE), and everything Ferry says
or decides by it.

offload_core moves every kind the same way; the kind is for people and for the planner. A
graph that offloads both its diffusion model and its text encoder shows two lines in the
sidebar, the panel and the memory report, and each line says which it is ("text encoder:
clip_l + t5xxl") from the kind the host gave ``apply_offload``, never from the network's class
name. The planner lists every network a prompt loads by its kind (a VAE too: its RAM counts,
though Ferry never offloads one) and weighs how often a prompt reads it.

Each member of ``OffloadKind`` is one row; nothing else in the pack spells a kind's words, its
order or how often it is read (tests/test_kind_table.py). A new kind is one row here, one
site (seam/site.py) and one node file per host.
"""

from __future__ import annotations

from enum import Enum

from .errors import ConfigError


class OffloadKind(str, Enum):
    """One row per kind, in listing order (the sidebar's, the panel's, the report's and the
    plan's lines: the diffusion model's first, then the text encoders', then the networks
    beside them; a plan puts the kinds read every step first, ``plan_order``)."""

    # value           label           noun (what an error calls it)  offloaded per_step
    MODEL = ("model", "model", "diffusion model", True, True)
    TEXT_ENCODER = ("text_encoder", "text encoder", "text encoder", True, False)
    CONTROLNET = ("controlnet", "ControlNet", "ControlNet", True, True)
    MODEL_PATCH = ("model_patch", "model patch", "model patch", True, True)
    CLIP_VISION = ("clip_vision", "CLIP vision", "CLIP vision model", True, False)
    VAE = ("vae", "VAE", "VAE", False, False)

    _value_: str
    #: The words a line starts with: "text encoder: t5xxl".
    label: str
    #: What an error or a tooltip calls the network: "the diffusion model to offload".
    noun: str
    #: Whether a Ferry node offloads it (False: listed by the planner for its RAM only).
    offloaded: bool
    #: Whether a prompt reads it at every sampling step, as often as the diffusion model (a
    #: ControlNet's blocks, a model patch's); False: once a prompt (an encoder, the VAE).
    per_step: bool

    def __new__(
        cls, value: str, label: str, noun: str, offloaded: bool, per_step: bool
    ) -> OffloadKind:
        member = str.__new__(cls, value)
        member._value_ = value
        member.label = label
        member.noun = noun
        member.offloaded = offloaded
        member.per_step = per_step
        return member

    def line_title(self, name: str) -> str:
        """The line's title: ``text encoder: t5xxl``."""
        return f"{self.label}: {name}"

    @property
    def plan_order(self) -> tuple[bool, int]:
        """Where a plan lists it: the kinds every step reads first, then in listing order."""
        return (not self.per_step, LISTING_ORDER[self])


#: The order lines are listed in (the table's order).
LISTING_ORDER = {kind: i for i, kind in enumerate(OffloadKind)}
#: A member is its value's str (equal, same hash), so one lookup takes both.
_BY_VALUE: dict[str, OffloadKind] = {k.value: k for k in OffloadKind}
#: The kinds a Ferry node offloads (``apply_offload``'s ``kind``).
OFFLOADED: tuple[OffloadKind, ...] = tuple(k for k in OffloadKind if k.offloaded)


def parse_kind(value: object) -> OffloadKind:
    """An offloaded ``OffloadKind`` or its value ("model", "text_encoder"); anything else
    (a VAE too: Ferry lists it but never offloads it) is refused by name, before any weight
    moves."""
    kind = _BY_VALUE.get(value) if isinstance(value, str) else None
    if kind is None or not kind.offloaded:
        choices = ", ".join(repr(k.value) for k in OFFLOADED)
        raise ConfigError("kind", f"must be one of {choices}, got {value!r}")
    return kind


def network_kind(value: object) -> OffloadKind:
    """Any kind of the table, offloaded or not, or its value; anything else is refused."""
    kind = _BY_VALUE.get(value) if isinstance(value, str) else None
    if kind is None:
        choices = ", ".join(repr(k.value) for k in OffloadKind)
        raise ConfigError("kind", f"must be one of {choices}, got {value!r}")
    return kind
