"""Errors Ferry raises. Each message names the setting a user changes to fix it."""

from __future__ import annotations


class FerryError(Exception):
    """Base class of every error Ferry raises on purpose."""


class ConfigError(FerryError, ValueError):
    """A setting is invalid for this model or machine. ``setting`` names it."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting


class GroupingError(ConfigError):
    """The model cannot be split the way the policy asks."""


class DiskPathError(ConfigError):
    """The disk tier's folder cannot be used (missing, a file, read-only, too small)."""


class AlreadyOffloadedError(FerryError):
    """apply_offload was called on a model that already has Ferry's offload."""


class CorruptGroupFileError(FerryError):
    """A group file on disk is truncated, changed or corrupted; its bytes are not used."""


class OffloadRemovedError(FerryError):
    """The offload handle was removed; the model is resident again."""


class WeightsLostError(CorruptGroupFileError):
    """remove() could not read some groups back (their only copy was a damaged file): the
    offload is gone all the same and those tensors are on the meta device. ``groups`` and
    ``files`` name them."""

    def __init__(self, groups: list[str], files: list[str], first: BaseException) -> None:
        super().__init__(
            f"the weights of {len(groups)} group(s) ({', '.join(groups[:3])}) were only in "
            f"damaged file(s) ({', '.join(files[:3])}: {first}); the offload was removed and "
            "those tensors are on the meta device: load the model again from its file"
        )
        self.groups = groups
        self.files = files
