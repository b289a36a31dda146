"""The "Ferry offload" accordion's values -> a validated ForgeOffload, every error naming a control.

Pure logic (no Forge, no Gradio), so CI tests it directly; webui/script.py only calls it.
A ConfigError from offload_core names a *setting* ("vram_budget_gb"); a Forge user sees
*controls* ("VRAM budget"), so each error is re-raised as ControlError naming the control.

The accordion's values reach a script positionally (the UI, and API callers' ``args``), so
``CONTROLS`` is their order, stable forever: new controls go last.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..offload_core import ConfigError, DiskTier, FerryError, OffloadPolicy
from ..offload_core.control_defaults import PLANNED_SETTINGS, control_defaults
from ..offload_core.disk.folder import check_disk_folder
from ..offload_core.planner import Choice, Wish, with_choice
from ..offload_core.policy import (
    AUTO,
    LEVEL_NAMES,
    TIER_NAMES,
    BlockLevel,
    LeafLevel,
    PinnedRamTier,
    RamTier,
    SharedRamTier,
    Tier,
    parse_blocks_per_group,
    parse_disk_path,
    parse_prefetch_depth,
    parse_vram_budget,
)
from ..seam.controls import ControlNames
from ..seam.offload import HeldOffload

SECTION = "Ferry offload"

#: (control id, label), in the order the script receives their values.
CONTROLS = (
    ("enabled", SECTION),
    ("level", "How to cut the UNet"),
    ("blocks_per_group", "Blocks per group"),
    ("tier", "Where the rest waits"),
    ("disk_path", "Disk folder"),
    ("prefetch_depth", "Look-ahead"),
    ("vram_budget", "VRAM budget (GiB)"),
    ("use_saved", "Use saved settings"),
    ("text_encoder", "Offload the text encoder too"),
)
LABELS = dict(CONTROLS)
LEVELS = LEVEL_NAMES
TIERS = TIER_NAMES
#: The accordion's own switches: off until ticked.
SWITCHES = ("enabled", "use_saved", "text_encoder")
#: Each control's default: the policy's (offload_core/control_defaults.py), with the planner's
#: settings on "auto" (webui/auto_plan.py chooses them, as for ComfyUI's widgets of the same
#: names); off for the switches.
_CONTROL_DEFAULTS = control_defaults(planned=True)
DEFAULTS: dict[str, Any] = {
    c: False if c in SWITCHES else _CONTROL_DEFAULTS[c] for c, _ in CONTROLS
}
#: The controls that may say "auto": the planner chooses them.
AUTO_CONTROLS = PLANNED_SETTINGS

#: Which control fixes each setting: the shared ids (seam/controls.py); a setting this
#: accordion does not show (headroom, direct_io, ...) is said whole, under Use saved settings.
NAMES = ControlNames(
    saved="use_saved",
    saved_help=(
        "the saved setting {setting!r} is invalid ({message}); fix it in the Ferry tab "
        "and Save, or turn Use saved settings off and set the controls here"
    ),
    unshown="use_saved",
)


class ControlError(FerryError, ValueError):
    """A control's value cannot be used. str() starts with "Ferry offload › <label>: "."""

    def __init__(self, control: str, message: str) -> None:
        label = LABELS.get(control, control)
        where = SECTION if control == "enabled" else f"{SECTION} › {label}"
        super().__init__(f"{where}: {message}")
        self.control = control
        self.message = message


def as_control_error(err: ConfigError, *, saved: bool = False) -> ControlError:
    """Re-labels an offload_core ConfigError with the control that fixes it."""
    return ControlError(*NAMES.relabel(err, saved=saved))


@dataclass(frozen=True)
class ForgeOffload(HeldOffload):
    """What a Ferry patcher carries through Forge's clones (seam/offload.py), and whether its
    values came from the settings file (then an error names Use saved settings)."""

    name: str = "unet"
    from_saved: bool = False

    def infotext(self) -> str:
        """The infotext value (key ``INFOTEXT_KEY``): every setting but the folder, which is
        a path on this machine and means nothing on another."""
        return describe(self.policy)


INFOTEXT_KEY = "Ferry"
#: Appended to the infotext value where the text encoder went through Ferry too.
TEXT_ENCODER_INFOTEXT = ", text encoder too"


def describe(policy: OffloadPolicy) -> str:
    """``block 2, disk, look-ahead 1, VRAM budget auto``; ``parse_infotext`` reads it back."""
    d = policy.to_dict()
    level = f"block {d['blocks_per_group']}" if d["level"] == "block" else "leaf"
    budget = d["vram_budget_gb"]
    shown = "none" if budget is None else budget if budget == "auto" else f"{round(budget, 3)} GiB"
    return f"{level}, {d['tier']}, look-ahead {d['prefetch_depth']}, VRAM budget {shown}"


_INFOTEXT = re.compile(
    r"\s*(?:block (?P<blocks>\d+)|(?P<leaf>leaf))\s*,\s*(?P<tier>pinned|ram|disk)\s*,"
    r"\s*look-ahead (?P<depth>\d+)\s*,\s*VRAM budget (?P<budget>none|auto|(?P<gib>[\d.]+) Gi?B)\s*"
    r"(?P<te>,\s*text encoder too\s*)?"
)


def parse_infotext(text: Any) -> dict[str, Any] | None:
    """Control values from an infotext's ``Ferry`` value (pasting an image's parameters);
    None when ``text`` is not one (Ferry was off, or another writer's format)."""
    m = _INFOTEXT.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        return None
    # Images saved before the units change say "2 GB": the same GiB (units.py), read alike.
    budget = m["gib"] or m["budget"]
    return {
        "enabled": True,
        "level": "leaf" if m["leaf"] else "block",
        "blocks_per_group": int(m["blocks"] or 1),
        "tier": m["tier"],
        "prefetch_depth": int(m["depth"]),
        "vram_budget": "" if budget == "none" else budget,
        "use_saved": False,
        "text_encoder": bool(m["te"]),
    }


def controls_dict(values: tuple[Any, ...] | list[Any]) -> dict[str, Any]:
    """The script's positional values as {control id: value}; missing trailing ones default
    (an API caller that predates a control), extra ones are refused."""
    if len(values) > len(CONTROLS):
        raise ControlError(
            "enabled",
            f"got {len(values)} values for {len(CONTROLS)} controls "
            f"({', '.join(c for c, _ in CONTROLS)}); check the API call's args",
        )
    out = dict(DEFAULTS)
    out.update(zip((c for c, _ in CONTROLS), values))
    return out


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


@dataclass(frozen=True)
class Asked:
    """The accordion's settings, each control parsed once. ``wish``: what the user fixed of
    tier, blocks per group and look-ahead, None where a control says "auto" (the planner's,
    webui/auto_plan.py); ``disk_path``: the disk tier's folder (the box's, else the default);
    ``saved``: the policy Use saved settings reads, applied whole."""

    wish: Wish
    leaf: bool = False
    disk_path: str = ""
    vram_budget: int | Literal["auto"] | None = AUTO
    saved: OffloadPolicy | None = None

    @property
    def from_saved(self) -> bool:
        return self.saved is not None

    @property
    def planned(self) -> bool:
        """Whether a control left to auto needs the planner's choice (``policy``)."""
        w = self.wish
        blocks = 1 if self.leaf else w.blocks_per_group  # layer by layer has no groups of blocks
        return self.saved is None and None in (w.tier, blocks, w.prefetch_depth)

    @property
    def headroom_bytes(self) -> int:
        return (self.saved or OffloadPolicy()).headroom_bytes

    def policy(self, choice: Choice | None = None) -> OffloadPolicy:
        """The policy to run: what the user fixed, and the planner's ``choice`` where a
        control says auto, applied as typed values (no widget string in between). Raises
        ConfigError (a setting's name) for a value the policy refuses."""
        if self.saved is not None:
            return self.saved
        if self.planned and choice is None:
            raise ValueError("an accordion setting is auto: plan it first (webui/auto_plan.py)")
        w = self.wish
        disk_asked = "disk" in (w.tier, choice.tier if choice else None)
        disk = DiskTier(self.disk_path) if disk_asked else None
        tier: Tier = (
            disk
            if w.tier == "disk" and disk
            else RamTier()
            if w.tier == "ram"
            else SharedRamTier()
            if w.tier == "shared"
            else PinnedRamTier()
        )
        fixed = OffloadPolicy(
            level=LeafLevel() if self.leaf else BlockLevel(w.blocks_per_group or 1),
            tier=tier,
            prefetch_depth=w.prefetch_depth or 1,
            vram_budget=self.vram_budget,
        )
        if choice is None:
            fixed.validate()
            return fixed
        # What the user left on auto, from the plan: the one typed application both hosts use.
        return with_choice(fixed, choice, disk)


def _saved(policy: OffloadPolicy) -> Asked:
    d = policy.to_dict()
    leaf = d["level"] == "leaf"
    wish = Wish(policy.tier_name, None if leaf else d["blocks_per_group"], policy.prefetch_depth)
    folder = policy.tier.path if isinstance(policy.tier, DiskTier) else ""
    return Asked(wish, leaf, folder, policy.vram_budget, saved=policy)


def _folder(c: dict[str, Any], default: str, tier: str) -> str:
    """The disk folder: the box's (empty: ``default``), checked where the disk tier may run
    (tier disk or auto); for another tier only the planner's figures read it, so a box it
    cannot use counts as the default there."""
    if tier in ("disk", AUTO):
        return parse_disk_path(c["disk_path"], default)
    try:
        return parse_disk_path(c["disk_path"], default)
    except ConfigError:
        return default


def asked_from_controls(
    values: tuple[Any, ...] | list[Any],
    *,
    default_disk_path: str,
    load_saved: Callable[[], Any],
) -> Asked | None:
    """The settings the controls ask for (None: Ferry is off), each parsed once.

    ``load_saved`` is settings_file.load_settings (the file the Ferry tab's Save writes and
    ComfyUI's nodes read); it is called only with Use saved settings on. Raises ControlError.
    """
    c = controls_dict(values)
    if not isinstance(c["enabled"], bool):
        raise ControlError("enabled", f"must be true or false, got {c['enabled']!r}")
    if not c["enabled"]:
        return None
    if c["use_saved"]:
        try:  # the file holds a full disk folder where the tier is disk (its parser checks)
            return _saved(load_saved().policy)
        except ConfigError as e:
            raise as_control_error(e, saved=True) from None
    level, tier = c["level"], c["tier"]
    if level not in LEVELS:
        raise ControlError("level", f"must be one of {list(LEVELS)}, got {level!r}")
    tier = AUTO if is_auto(tier) else tier
    if tier != AUTO and tier not in TIERS:
        raise ControlError("tier", f"must be 'auto' or one of {list(TIERS)}, got {tier!r}")
    try:
        # Each value goes through its setting's one parser (offload_core/policy.py).
        blocks, depth, leaf = c["blocks_per_group"], c["prefetch_depth"], level == "leaf"
        wish = Wish(
            tier=None if tier == AUTO else tier,
            # Layer by layer has no blocks per group (the planner sizes its own groups then).
            blocks_per_group=None if leaf or is_auto(blocks) else parse_blocks_per_group(blocks),
            prefetch_depth=None if is_auto(depth) else parse_prefetch_depth(depth),
        )
        folder = _folder(c, default_disk_path, tier)
        return Asked(wish, leaf, folder, parse_vram_budget(c["vram_budget"]))
    except ConfigError as e:
        raise as_control_error(e) from None


def offload_from_controls(
    values: tuple[Any, ...] | list[Any],
    *,
    default_disk_path: str,
    load_saved: Callable[[], Any],
    name: str = "unet",
    choice: Choice | None = None,
) -> ForgeOffload | None:
    """The offload the controls ask for (None: Ferry is off), validated; ``choice``: the
    planner's, for the controls on auto (webui/auto_plan.py). Raises ControlError."""
    asked = asked_from_controls(values, default_disk_path=default_disk_path, load_saved=load_saved)
    if asked is None:
        return None
    try:
        return ForgeOffload(asked.policy(choice), name, from_saved=asked.from_saved)
    except ConfigError as e:
        raise as_control_error(e, saved=asked.from_saved) from None


def switched_on(values: tuple[Any, ...] | list[Any], switch: str | None) -> bool:
    """Whether the network behind the box ``switch`` goes through Ferry too: the accordion on
    and that box ticked ("Offload the text encoder too": it then takes the UNet's settings).
    Raises ControlError."""
    if switch is None:
        return False
    c = controls_dict(values)
    for control in ("enabled", switch):
        if not isinstance(c[control], bool):
            raise ControlError(control, f"must be true or false, got {c[control]!r}")
    return bool(c["enabled"] and c[switch])


def check_folder(offload: ForgeOffload) -> None:
    """The disk tier's folder, checked read-only before the generation loads anything (the
    same check, and the same words, as the panel's field and ComfyUI's node). Free space is
    checked when the groups are laid out: groups read from the checkpoint need none."""
    tier = offload.policy.tier
    if not isinstance(tier, DiskTier):
        return
    check = check_disk_folder(tier.path, None)
    if not check.ok:
        control = "use_saved" if offload.from_saved else "disk_path"
        raise ControlError(control, check.message)


def check_blocks(offload: ForgeOffload, max_blocks: int, what: str = "this model") -> None:
    """Blocks per group against the longest run of blocks of ``what`` (``plan.max_blocks_per_group``)."""
    k = getattr(offload.policy.level, "blocks_per_group", 1)
    if k > max_blocks:
        control = "use_saved" if offload.from_saved else "blocks_per_group"
        raise ControlError(
            control, f"{what} has at most {max_blocks} blocks in a row; choose 1..{max_blocks}"
        )
