"""Errors Ferry raises. Each message names the setting a user changes to fix it.

offload_core is a Python API and the engine under ComfyUI's nodes and the panel, so its
messages name settings, files and folders, never a Python call, with one exception:
``ApiUseError`` and its subclasses, which report a misuse of the Python API itself (applying
twice, autograd on); their messages may say which call fixes it. Nodes never show those as
they are: nodes/patcher/recovery.py (``for_node``) says what to do in ComfyUI instead.
tests/test_messages.py holds both sides to this.
"""

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


class ApiUseError(FerryError):
    """The Python API was used in a way it does not support; the message may name the call
    that fixes it (see the module's docstring)."""


class AlreadyOffloadedError(ApiUseError):
    """apply_offload was called on a model that already has Ferry's offload."""


class CorruptGroupFileError(FerryError):
    """A group file on disk is truncated, changed or corrupted; its bytes are not used."""


class UnsupportedTensorError(FerryError):
    """A layer holds a tensor Ferry cannot move bit-exact with its class and attributes kept;
    found while planning, before anything moves."""

    def __init__(self, layer: str, type_name: str, why: str) -> None:
        super().__init__(
            f"{layer}: Ferry cannot offload a {type_name} tensor: {why}. Load this model with a "
            "loader whose weights are plain tensors, torchao tensors or GGUF (ComfyUI-GGUF), "
            "or leave it resident (no Ferry offload)"
        )
        self.layer = layer
        self.type_name = type_name


class InferenceOnlyError(ApiUseError):
    """A forward ran with autograd on over parameters that require grad: Ferry's offload is
    for inference."""


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


class RestoreIncompleteError(FerryError):
    """remove() could not read some groups back for a reason that is not their file's bytes
    (the platform refused a call, no memory, a bug in Ferry): nothing was dropped. Those
    groups stay offloaded, their files and the model's layout as they were; remove() again
    (once the cause is fixed) restores them. ``groups`` names them, ``cause`` is the error."""

    def __init__(self, groups: list[str], cause: BaseException) -> None:
        self.groups = groups
        self.cause = cause
        super().__init__(
            f"could not read {len(groups)} group(s) back ({', '.join(groups[:3])}"
            f"{', ...' if len(groups) > 3 else ''}): {type(cause).__name__}: {cause}. Nothing "
            "was lost: those groups are still offloaded, their files kept; remove the offload "
            "again once that is fixed"
        )
