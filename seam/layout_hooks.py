"""What a host does around its live layout's changes (seam/live_layout.py calls each hook; each
does nothing here): a host's layout class overrides the ones its loader needs
(``nodes/patcher/live_layout.py``, ``webui/live_layout.py``, ``tests/seam_test_host.py``)."""

from __future__ import annotations

from ..offload_core.errors import WeightsLostError


class LayoutHooks:
    def made_plain(self) -> None:
        """The network is plain again and about to be planned on or laid out: what the host's
        own load would do to its weights first (Forge bakes GGUF weights)."""

    def laying_out(self) -> None:
        """Right before the groups are laid out (the weights are ready)."""

    def laid_out(self, done: bool) -> None:
        """After a layout: ``done`` False where it failed (the network is as it was)."""

    def released(self) -> None:
        """After the layout was removed (every parameter back as it was)."""

    def let_go_of(self) -> None:
        """After a layout this one did not expect was removed (the host's counts of it)."""

    def weights_lost(self, err: WeightsLostError) -> BaseException:
        """What to raise where removing the layout found its only copy of some weights gone."""
        return err
