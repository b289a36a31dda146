"""What a host's Ferry patcher carries through the host's clones: how to offload, and the name
and kind the model goes by (logs, the panel, the stats: "text encoder: t5xxl"). Each host adds what only it needs
(``nodes/planning/config.py`` ComfyOffload, ``webui/controls.py`` ForgeOffload)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import TypeVar

from ..offload_core import DiskTier, OffloadKind, OffloadPolicy

#: Files the disk tier can read groups from as they are (offload_core/formats: by content,
#: so a renamed file is read too; the suffix only keeps a pickled .ckpt from being opened).
SOURCE_SUFFIXES = (".safetensors", ".gguf")

H = TypeVar("H", bound="HeldOffload")


@dataclass(frozen=True)
class HeldOffload:
    policy: OffloadPolicy
    name: str
    kind: OffloadKind = OffloadKind.MODEL
    #: Why its settings are what they are: the planner's sentence, where it chose them (None:
    #: the user set them). It rides to the layout's handle, so every line of this network (the
    #: sidebar, the memory report, the panel) says its own. Not what the offload is
    #: (compare=False): a new sentence for the same settings keeps the layout.
    why: str | None = field(default=None, compare=False)

    @property
    def title(self) -> str:
        """How logs and UIs name it: ``text encoder: t5xxl``."""
        return self.kind.line_title(self.name)

    def with_source_checkpoint(self: H, path: str | None) -> H:
        """Lets the disk tier read unchanged groups straight from ``path``, the file the host
        loaded the model from; as it is where the tier is not disk, or where ``path`` is no
        file the disk tier reads (gone since the host loaded it, or another format): then the
        groups are written, as for a model with no file."""
        tier = self.policy.tier
        if not isinstance(tier, DiskTier) or not is_readable_source(path):
            return self
        policy = replace(self.policy, tier=replace(tier, source_checkpoint=path))
        return replace(self, policy=policy)


def is_readable_source(path: str | None) -> bool:
    """Whether ``path`` is a file the disk tier can read groups from."""
    return bool(path) and str(path).endswith(SOURCE_SUFFIXES) and os.path.isfile(str(path))
