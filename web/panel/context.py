"""What the panel works on: the settings file, the live offloaded models, the demo model.

No gradio here: the views call these methods, and tests call them directly. One lock
(``run_lock``) serialises everything that runs or re-offloads a model, so Apply never
swaps a policy under a running forward ("between runs").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...offload_core import (
    BlockLevel,
    ConfigError,
    FerryError,
    OffloadPolicy,
    RamTier,
    apply_offload,
    live_offloads,
)
from ...offload_core.model.layout import module_nbytes
from ...offload_core.tools.monitor import Monitor, get_monitor
from ...offload_core.tools.settings_file import (
    PanelSettings,
    default_settings_path,
    load_settings,
    save_settings,
)
from ...seam.plans import Plans

SAVED_FOR_COMFYUI = "ComfyUI's Ferry nodes with *use panel settings* read it."
APPLY_REOFFLOADS = "**Apply** re-offloads the models loaded now (between runs)."
#: Bound for the blocks-per-group slider when no model is known yet (ComfyUI, nothing loaded).
DEFAULT_MAX_BLOCKS = 64


def model_bytes(model: torch.nn.Module) -> int:
    """The model's size as Ferry lays it out (torchao tensors by their inner tensors)."""
    return module_nbytes(model)


@dataclass
class DemoSession:
    """The built-in demo model the standalone panel offloads and runs, and the plans on its
    meta twin (seam/plans.py) that the settings preview shows. ``size_gb`` is GiB, as every
    memory amount a user types (units.py)."""

    size_gb: float
    tokens: int = 64
    dtype: torch.dtype = torch.float32
    model: torch.nn.Module | None = None
    plans: Plans | None = None
    inputs: dict[str, Any] = field(default_factory=dict)

    def build(self, device: str = "cpu") -> None:
        from ...offload_core.model.demo import build_demo_model, demo_inputs

        self.model = build_demo_model(self.size_gb, self.dtype, seed=0)
        # Inputs live where the forward runs: the engine brings weights there, not inputs.
        self.inputs = demo_inputs(self.model, batch=1, tokens=self.tokens, seed=0, device=device)
        self.plans = Plans.on_twin(self.model)


class PanelContext:
    """State shared by all pages of one panel server."""

    def __init__(
        self,
        *,
        settings_path: str | Path | None = None,
        demo: DemoSession | None = None,
        onload_device: str | None = None,
        monitor: Monitor | None = None,
        is_busy: Callable[[], bool] | None = None,
        reapply_hook: Callable[[Any, OffloadPolicy], str] | None = None,
        reference: Callable[[], Plans | None] | None = None,
        saved_note: str = SAVED_FOR_COMFYUI,
        apply_note: str = APPLY_REOFFLOADS,
    ) -> None:
        self.settings_path = Path(settings_path) if settings_path else default_settings_path()
        self.demo = demo
        self.monitor = monitor or get_monitor()
        self.onload_device = onload_device or self.monitor.device or "cpu"
        self.is_busy = is_busy or (lambda: False)
        # A host that keeps its own reference to each handle (ComfyUI's live layout) re-offloads
        # through its own code: hook(handle, policy) -> one status line.
        self.reapply_hook = reapply_hook
        # A host whose model is known before it is offloaded (Forge's UNet) gives the plans
        # on its meta twin for the previews: reference() -> Plans, or None.
        self.reference = reference
        # Who reads the saved file, said after Save; what Apply does in this host.
        self.saved_note = saved_note
        self.apply_note = apply_note
        self.run_lock = threading.Lock()
        self.last_status = ""

    # ---- settings -----------------------------------------------------------------------
    def load(self) -> PanelSettings:
        return load_settings(self.settings_path)

    def save(self, settings: PanelSettings) -> Path:
        return save_settings(settings, self.settings_path)

    # ---- the model the settings are for --------------------------------------------------
    def reference_plans(self) -> Plans | None:
        """The plans previews show: on the demo's meta twin, on the host's reference model,
        else none (see plan)."""
        if self.demo is not None and self.demo.plans is not None:
            return self.demo.plans
        return self.reference() if self.reference is not None else None

    def reference_model(self) -> torch.nn.Module | None:
        """The (meta) model previews are planned on, if any."""
        plans = self.reference_plans()
        return None if plans is None else plans.basis

    def _live_plan(self) -> Any | None:
        # Inside ComfyUI there is no twin: the loaded model is already offloaded, so its
        # current plan is what we can show (and its block count bounds the slider).
        for h in live_offloads():
            if getattr(h, "plan", None) is not None:
                return h.plan
        return None

    def plan(self, policy: OffloadPolicy) -> Any | None:
        """The plan of ``policy`` (nothing moves), or the live model's plan, or None."""
        plans = self.reference_plans()
        if plans is None:
            return self._live_plan()
        return plans.plan(policy, self.onload_device)

    def max_blocks(self) -> int:
        probe = OffloadPolicy(level=BlockLevel(1), tier=RamTier())
        try:
            plan = self.plan(probe)
        except FerryError:
            return DEFAULT_MAX_BLOCKS
        if plan is None:
            return DEFAULT_MAX_BLOCKS
        # A slider needs max > min: a model with no block list still shows 1..2.
        return max(2, int(plan.max_blocks_per_group))

    def needed_disk_bytes(self) -> int | None:
        """What the disk tier would hold: every block's weights (an upper bound)."""
        model = self.reference_model()
        if model is not None:
            return model_bytes(model)
        live = self._live_plan()
        return None if live is None else sum(g.nbytes for g in live.groups)

    # ---- running and re-applying -----------------------------------------------------------
    def start_demo(self, settings: PanelSettings) -> str:
        """Builds the demo model and offloads it with the saved settings."""
        assert self.demo is not None
        self.demo.build(self.onload_device)
        assert self.demo.model is not None
        try:
            apply_offload(
                self.demo.model, settings.policy, onload_device=self.onload_device, name="demo"
            )
        except ConfigError as e:
            # A saved disk path that is gone must not stop the panel: run resident, say why.
            self.demo.model.to(self.onload_device)
            return f"demo model runs without offload: {e}"
        return "demo model offloaded with the saved settings"

    def run_demo(self, seconds: float, progress: Callable[[float], None] | None = None) -> str:
        """Runs the demo model's forward for about ``seconds`` so the plots have something to show."""
        if self.demo is None or self.demo.model is None:
            raise ConfigError(
                "demo", "this panel has no demo model (it runs inside ComfyUI or a WebUI)"
            )
        with one_run(self, "run", "run the demo"):
            model, inputs = self.demo.model, self.demo.inputs
            n = 0
            t0 = time.perf_counter()
            with torch.inference_mode():
                while n == 0 or time.perf_counter() - t0 < seconds:
                    model(**inputs)
                    n += 1
                    if progress is not None:
                        progress(min(1.0, (time.perf_counter() - t0) / max(seconds, 1e-9)))
            dt = time.perf_counter() - t0
        return f"ran {n} forward(s) in {dt:.2f} s ({dt / n:.3f} s each)"

    def reapply(self, policy: OffloadPolicy) -> list[str]:
        """Re-offloads every live model with ``policy``: remove(), then apply_offload.

        Refused while something runs (the host's is_busy, or a panel run): Apply is for
        between runs. Returns one line per model.
        """
        policy.validate()
        with one_run(self, "apply", "Apply again"):
            lines = []
            for h in live_offloads():
                if self.reapply_hook is not None:
                    lines.append(self.reapply_hook(h, policy))
                    continue
                model = getattr(h, "model", None)
                if model is None:
                    continue
                name = getattr(h, "name", None)
                device = getattr(h, "device", None) or self.onload_device
                h.remove()
                try:
                    apply_offload(model, policy, onload_device=str(device), name=name)
                except FerryError as e:
                    # The model stays resident (remove() put it back); say so, keep going.
                    lines.append(f"{name}: not re-offloaded ({e}); it now runs without offload")
                    continue
                lines.append(f"{name}: re-offloaded")
            return lines or ["no offloaded model is loaded; the settings apply at the next load"]


@contextmanager
def one_run(ctx: Any, setting: str, again: str) -> Iterator[None]:
    """Holds the panel's one run (a demo run, the planner, Apply) while it runs; refused,
    by ``setting``, while the host runs a job (``ctx.is_busy``) or another panel run holds
    ``ctx.run_lock``. ``again``: what to do when it has finished ("Apply again")."""
    if ctx.is_busy():
        raise ConfigError(setting, f"a job is running; {again} when it has finished")
    if not ctx.run_lock.acquire(blocking=False):
        raise ConfigError(
            setting, "busy: the planner, a demo run or Apply is running; try again when it ends"
        )
    try:
        yield
    finally:
        ctx.run_lock.release()
