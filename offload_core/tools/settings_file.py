"""The settings file the panel writes and the nodes' "use panel settings" reads.

One small JSON file per user, so an artist can pick settings once in the panel and every
workflow uses them. The file holds the flat policy form (``OffloadPolicy.to_dict``) plus the
quantization preset; both are validated on save AND on load, so a hand-edited file with a
typo fails with a message naming the setting instead of silently running with defaults.

    {"ferry_settings": 1,
     "policy": {"level": "block", "blocks_per_group": 2, "tier": "disk", ...},
     "quant_preset": "none",
     "budgets": {"vram_gb": 10.0, "ram_gb": null}}   (optional: Ferry's budgets)
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..disk.durable import atomic_write
from ..errors import ConfigError
from ..policy import OffloadPolicy, parse_gib
from ..units import GIB

FORMAT_VERSION = 1
ENV_VAR = "FERRY_SETTINGS"
# The preset names the quant helper exports; used only when offload_core.quant is missing,
# so that reading a settings file never needs torchao.
_KNOWN_PRESETS_FALLBACK = (
    "none",
    "int8-weight",
    "int8-dynamic",
    "float8-weight",
    "int4-weight",
    "float8-dynamic",
)


def default_settings_path() -> Path:
    """``$FERRY_SETTINGS`` if set, else the per-user config folder's ``ferry/settings.json``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "ferry" / "settings.json"


def known_quant_presets() -> tuple[str, ...]:
    """The preset names offload_core.quant offers (imported lazily: it pulls in torchao)."""
    try:
        from ..quant import PRESETS
    except ImportError:
        return _KNOWN_PRESETS_FALLBACK
    return tuple(PRESETS)


_BUDGET_HELP = "type a number of GiB above 0 (e.g. 16), or leave it empty for no limit"


@dataclass(frozen=True)
class Budgets:
    """Ferry's VRAM and RAM budgets (bytes; None: no cap), set from the sidebar, the panel
    or the /ferry/budgets route; the planner reads them at each prompt."""

    vram: int | None = None
    ram: int | None = None

    def to_dict(self) -> dict[str, float | None]:
        return {
            k: None if v is None else v / GIB
            for k, v in (("vram_gb", self.vram), ("ram_gb", self.ram))
        }

    @classmethod
    def from_dict(cls, d: Any) -> Budgets:
        if not isinstance(d, dict):
            raise ConfigError("budgets", f"must be a JSON object, got {type(d).__name__}")
        unknown = set(d) - {"vram_gb", "ram_gb"}
        if unknown:
            raise ConfigError(sorted(unknown)[0], "unknown budget; known: ['ram_gb', 'vram_gb']")
        return cls(
            # Named by their keys here (the route's body, the file's "budgets"), not by the
            # node's vram_budget_gb: the sidebar's box is what to change.
            parse_gib("vram_gb", d.get("vram_gb"), _BUDGET_HELP),
            parse_gib("ram_gb", d.get("ram_gb"), _BUDGET_HELP),
        )


@dataclass(frozen=True)
class PanelSettings:
    """What the panel saves: how to offload, which quantization preset to load with, and
    Ferry's budgets (None: not given, so saving keeps the budgets the file holds: the
    panel's form saves a policy without touching what the sidebar set)."""

    policy: OffloadPolicy = field(default_factory=OffloadPolicy)
    quant_preset: str = "none"
    budgets: Budgets | None = None

    @property
    def vram_budget(self) -> int | None:
        return None if self.budgets is None else self.budgets.vram

    @property
    def ram_budget(self) -> int | None:
        return None if self.budgets is None else self.budgets.ram

    def validate(self) -> None:
        if not isinstance(self.policy, OffloadPolicy):
            raise ConfigError(
                "policy", f"must be an OffloadPolicy, got {type(self.policy).__name__}"
            )
        self.policy.validate()
        presets = known_quant_presets()
        if self.quant_preset not in presets:
            raise ConfigError(
                "quant_preset",
                f"unknown preset {self.quant_preset!r}; choose one of {list(presets)}",
            )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "ferry_settings": FORMAT_VERSION,
            "policy": self.policy.to_dict(),
            "quant_preset": self.quant_preset,
        }
        if self.budgets is not None:
            out["budgets"] = self.budgets.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Any) -> PanelSettings:
        """Builds and validates settings; every error names the setting to change."""
        if not isinstance(d, dict):
            raise ConfigError("settings_file", f"must hold a JSON object, got {type(d).__name__}")
        version = d.get("ferry_settings", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise ConfigError(
                "ferry_settings",
                f"this Ferry reads settings format {FORMAT_VERSION}, the file says {version!r}; "
                "save the settings again from the panel",
            )
        unknown = set(d) - {"ferry_settings", "policy", "quant_preset", "budgets"}
        if unknown:
            raise ConfigError(
                sorted(unknown)[0], "unknown setting; known: ['budgets', 'policy', 'quant_preset']"
            )
        policy_dict = d.get("policy", {})
        if not isinstance(policy_dict, dict):
            raise ConfigError("policy", f"must be a JSON object, got {type(policy_dict).__name__}")
        quant = d.get("quant_preset", "none")
        if not isinstance(quant, str):
            raise ConfigError("quant_preset", f"must be a preset name, got {quant!r}")
        budgets = Budgets.from_dict(d["budgets"]) if "budgets" in d else None
        settings = cls(OffloadPolicy.from_dict(policy_dict), quant, budgets)
        settings.validate()
        return settings


def load_settings(path: str | os.PathLike[str] | None = None) -> PanelSettings:
    """Reads the settings file; a missing file gives the defaults (nothing saved yet)."""
    p = Path(path) if path is not None else default_settings_path()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return PanelSettings()
    except OSError as e:
        raise ConfigError("settings_file", f"cannot read {p}: {e.strerror or e}") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            "settings_file",
            f"{p} is not valid JSON (line {e.lineno}: {e.msg}); fix it or save again from the panel",
        ) from None
    return PanelSettings.from_dict(data)


def save_settings(settings: PanelSettings, path: str | os.PathLike[str] | None = None) -> Path:
    """Validates, then writes atomically (disk/durable.py: temp file, fsync, rename, folder
    fsync): a reader never sees half a file. A failed write removes only its temp file.

    Returns the path written.
    """
    settings.validate()
    p = Path(path) if path is not None else default_settings_path()
    if settings.budgets is None:  # not given: keep the file's (Budgets' docstring)
        try:
            settings = replace(settings, budgets=load_settings(p).budgets)
        except ConfigError:
            pass  # a broken file is being replaced: nothing in it to keep
    text = json.dumps(settings.to_dict(), indent=2, sort_keys=True) + "\n"
    with ExitStack() as stack:
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            # Private to its user (0600), as tempfile.mkstemp made it before.
            f = stack.enter_context(atomic_write(p, mode=0o600))
        except OSError as e:
            msg = f"cannot write in {p.parent}: {e.strerror or e}"
            raise ConfigError("settings_file", msg) from e
        f.write(text.encode("utf-8"))
    return p


def save_budgets(budgets: Budgets, path: str | os.PathLike[str] | None = None) -> PanelSettings:
    """Sets Ferry's budgets in the settings file, keeping its other settings (a broken file
    is refused: its error names what to fix). Returns what was saved."""
    current = load_settings(path)
    saved = replace(current, budgets=budgets)
    save_settings(saved, path)
    return saved
