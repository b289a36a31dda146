"""One model's live Ferry layout, kept across the patcher clones a host makes: any host.

Hosts clone a patcher at every node or script that changes it (ComfyUI's ModelPatcher,
Forge's UnetPatcher), and every clone shares one model object (ComfyUI's BaseModel, Forge's
KModel). So the layout belongs to that shared object, not to a patcher: a ``LiveLayout``
lives on it (``of``), and each Ferry patcher asks it to make the network match its offload
(``ensure``), to let go (``release``), or for a plan (``plan``). A host is a subclass that
fills in the hooks (``nodes/patcher/live_layout.py``, ``webui/live_layout.py``, ``tests/seam_test_host.py``).

The loader's handshake (which patcher loads next, which owns the layout) is seam/handshake.py,
where ``[Note: why a "loading" mark]`` is; the hooks a host fills in are seam/layout_hooks.py.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypeVar

import torch
from torch import nn

from ..offload_core import (
    CheckpointWeights,
    Ending,
    OffloadHandle,
    apply_offload,
    find_offload,
)
from ..offload_core.errors import WeightsLostError
from ..offload_core.model.layout import module_nbytes
from ..offload_core.model.plan import OffloadPlan
from ..offload_core.policy import AUTO, OffloadPolicy
from .handshake import Handshake
from .layout_hooks import LayoutHooks
from .offload import HeldOffload
from .plans import Plans

log = logging.getLogger("ferry")
Progress = Callable[[int, int], None]
FreeVram = Callable[[torch.device], "int | None"]
L = TypeVar("L", bound="LiveLayout")


@dataclass(frozen=True)
class LayoutKey:
    """What a live layout was made for: a patcher with another key lays the groups out again."""

    policy: OffloadPolicy
    device: str
    weights: Hashable  # the host's name for the weights' state (a LoRA set): None if plain
    name: str

    def same_offload(self, offload: HeldOffload) -> bool:
        return (self.policy, self.name) == (offload.policy, offload.name)


class LiveLayout(LayoutHooks):
    """The Ferry layout of ``module`` (the network every clone of one model shares), if any.

    A host subclass sets ``attr`` (where on the shared object it lives) and
    ``plans_on_twin``, and overrides the hooks below where its loader needs them.
    """

    attr: ClassVar[str]
    #: Plans drawn on a meta twin made once while the network is plain (the live layout is
    #: never touched by a plan), or on the network itself (then a plan for an offload other
    #: than the live one lets the live one go: that offload replaces it at its load). A host
    #: whose weights can change shape or kind after the first plan (ComfyUI: lazy Linears,
    #: quantized or GGUF tensors whose meta copies size otherwise) plans on the network.
    plans_on_twin: ClassVar[bool] = False

    def __init__(self, module: nn.Module, shared: Any = None) -> None:
        self.module = module
        self.handle: OffloadHandle | None = None
        self.key: LayoutKey | None = None
        #: Which patcher loads next and which owns the layout (seam/handshake.py).
        self.handshake = Handshake(_live_offload_of(weakref.ref(self)))
        #: The host's count of free memory on a device (vram_budget "auto"); None: offload_core's.
        self.free_vram: FreeVram | None = None
        self._shared = weakref.ref(shared) if shared is not None else None
        self._plans = Plans(module)
        self._twin_plans: Plans | None = None

    @classmethod
    def of(cls: type[L], shared: Any, module: nn.Module | None = None) -> L:
        """The layout stored on ``shared`` (the object every clone shares), created on first
        use; ``module`` is the network (by default ``shared.diffusion_model``)."""
        net: nn.Module = shared.diffusion_model if module is None else module
        lay = shared.__dict__.get(cls.attr)
        if lay is None or lay.module is not net:
            lay = cls(net, shared)
            shared.__dict__[cls.attr] = lay
        return lay  # type: ignore[no-any-return]

    def shared(self) -> Any:
        """The object every clone shares (None once it is gone)."""
        return self._shared() if self._shared is not None else None

    # -- reading ---------------------------------------------------------------------------
    @property
    def live(self) -> bool:
        return self.handle is not None and not self.handle.removed

    @property
    def weights_key(self) -> Hashable:
        return None if self.key is None else self.key.weights

    def serves(self, offload: HeldOffload, device: torch.device | str) -> bool:
        """True when the live layout is ``offload``'s on ``device`` (whatever its weights)."""
        k = self.key
        return self.live and k is not None and k.same_offload(offload) and k.device == str(device)

    def device_bytes(self) -> int:
        """Weights Ferry holds on the onload device (outside groups, resident groups, slots)."""
        return self.handle.plan.device_bytes if self.live and self.handle is not None else 0

    def plan(self, offload: HeldOffload, device: torch.device | str) -> OffloadPlan:
        """The plan of ``offload`` on ``device``: validates everything, moves nothing."""
        k = self.key
        live = self.handle if self.live else None
        if (
            live is not None
            and k is not None
            and (k.policy, k.device) == (offload.policy, str(device))
        ):
            return live.plan
        plans = self.twin_plans() if self.plans_on_twin else self._plans
        plan = plans.cached(offload.policy, device)
        if plan is not None:
            return plan
        if not self.plans_on_twin:
            self._let_go()  # plans are drawn on the plain network (see plans_on_twin)
        return plans.plan(offload.policy, device, budget=self.budget(offload.policy, device))

    def twin_plans(self) -> Plans:
        """Plans on the network's meta twin (made the first time: the network goes plain)."""
        if self._twin_plans is None:
            self._let_go()
            self.made_plain()
            self._twin_plans = Plans.on_twin(self.module)
        return self._twin_plans

    def budget(self, policy: OffloadPolicy, device: torch.device | str) -> OffloadPolicy:
        """``policy`` with "auto" resolved by the host's count of free memory, where it keeps
        one (the network's bytes are counted only then: a walk over every tensor)."""
        if policy.vram_budget != AUTO or self.free_vram is None:
            return policy
        free = self.free_vram(torch.device(device))
        on_device = 0 if free is None else module_nbytes(self.module, on=torch.device(device))
        return resolve_auto(policy, free, on_device)

    # -- changing --------------------------------------------------------------------------
    def ensure(
        self,
        offload: HeldOffload,
        device: torch.device | str,
        weights: Hashable,
        prepare: Callable[[], CheckpointWeights | None],
        progress: Progress | None = None,
    ) -> bool:
        """Makes the network laid out by ``offload`` on ``device`` with its weights in state
        ``weights``; returns True when it had to lay the groups out (again). ``prepare`` runs
        on the plain network first (the host's weight patches) and returns where the weights
        wait in a checkpoint, if they do (a network built on meta: groups filled from it)."""
        key = LayoutKey(offload.policy, str(device), weights, offload.name)
        if self.live and self.key == key and self.handle is not None:
            self.handle.why = offload.why  # this prompt's sentence for the layout it keeps
            return False
        self.plan(offload, device)  # every check, before anything moves
        owner = self.handshake.owner()  # the patcher that asked owns the new layout too
        self.release()
        self._let_go()  # a layout another holder lost track of (see plan())
        self.made_plain()
        from_file = prepare()
        self.laying_out()
        try:
            self.handle = apply_offload(
                self.module,
                self.budget(offload.policy, device),
                onload_device=device,
                name=offload.name,
                kind=offload.kind,
                progress=progress,
                weights=from_file,
            )
        except BaseException:
            self.laid_out(False)  # apply_offload put the network back as it was
            raise
        self.handle.why = offload.why
        self.key = key
        self.handshake.set_owner(owner)
        self._plans.remember(offload.policy, device, self.handle.plan)
        self.laid_out(True)
        return True

    def release(self, ending: Ending = Ending.RESTORE) -> bool:
        """Removes the layout and deletes Ferry's files. ``ending`` (offload_core/ending.py,
        [Note: release by kind of ending]): RESTORE when the host goes on using the network
        (every parameter back as it was, group by group), DISCARD when the host has dropped
        every object that could use it (Ferry's copies dropped, nothing read back)."""
        self.handshake.loading = None
        handle = self.handle
        if handle is None or handle.removed:
            self.handle, self.key = None, None
            return False
        try:
            handle.remove(ending)  # never stops half-way
        except WeightsLostError as e:  # their only copy was a damaged file
            raise self.weights_lost(e) from e
        finally:
            # A RestoreIncompleteError leaves the layout live (nothing dropped): kept, so the
            # next release tries again.
            if handle.removed:
                self.handle, self.key = None, None
                self.handshake.set_owner(None)
                self.released()
        how = "discarded, nothing read back" if ending is Ending.DISCARD else "weights given back"
        log.info("ferry: released %s (%s)", handle.name, how)
        return True

    def _let_go(self) -> None:
        """Whatever Ferry layout the network has (this one's or a lost one) is removed."""
        if find_offload(self.module) is None:
            return
        try:
            self.release()
            stray = find_offload(self.module)
            if stray is not None:  # laid out by other code: it goes, the next load redoes it
                stray.remove()
        finally:
            self.let_go_of()


def _live_offload_of(ref: weakref.ref[LiveLayout]) -> Callable[[], Hashable | None]:
    """What the layout behind ``ref`` serves now, (policy, name), for its handshake; weakly,
    so the layout (on the host's shared object) is freed with it, no cycle."""

    def live() -> Hashable | None:
        lay = ref()
        k = None if lay is None else lay.key
        return (k.policy, k.name) if lay is not None and lay.live and k is not None else None

    return live


def resolve_auto(policy: OffloadPolicy, free: int | None, on_device: int) -> OffloadPolicy:
    """``policy`` with vram_budget "auto" turned into bytes from the host's ``free`` count (the
    network's own bytes already on the device count as free: they move off), as offload_core
    does with ``torch.cuda.mem_get_info``; as it is where the host counts nothing (a CPU). A
    share the planner gave (``planned_vram``) is kept, capped by that count."""
    if policy.vram_budget != AUTO or free is None:
        return policy
    room = max(free + on_device - policy.headroom_bytes, 1)
    if policy.planned_vram is not None:
        room = max(min(room, policy.planned_vram), 1)
    return replace(policy, vram_budget=room)
