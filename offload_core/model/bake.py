"""LoRA baked once: a streamed weight that carries patches (ComfyUI-GGUF's ``patches``,
applied on every forward while dequantizing) replaced, before the layout, by the weight the
layer's own per-forward path computes from it, so each step moves that weight and computes
nothing for it.

[Note: baking a patched weight]
A GGUF layer computes its weight on every forward: dequantize the blocks, add each patch
(core's ``calculate_weight``), cast to the input's dtype; with four LoRAs that is about 3x
the time of no LoRA (city96/ComfyUI-GGUF #36). The result is the same on every step, so it
can be computed once, by the same code (the host hands the layer's own function as
``BakeTarget.compute``: nothing here re-implements it, so the result is bit-identical), on the
device the forward would compute it on, and kept in the tier in place of the blocks and their
patches; the layer then finds a plain weight of the compute dtype and uses it as it is.
The price is bytes: a baked weight is 2-4x its quantized blocks, moved on every step. So
"auto" bakes a network when the time its patched weights cost per step (measured once, on a
sample, scaled by bytes) is more than the extra bytes cost at the tier's copy speed; "on"
always, "off" never (the weights stream with their patches, as before). The choice and its
figures are one line of the log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..policy import BakeMode
from ..units import GB, fmt_bytes
from .layout import tensor_nbytes

#: How many targets "auto" times (the largest first: the fewest timer calls per byte).
SAMPLE = 6


@dataclass
class BakeTarget:
    """One patched weight: ``module``'s parameter ``name``, which the tier holds as
    ``stored_nbytes`` (blocks and patches); ``compute`` is the layer's own per-forward path
    (its result: the weight the layer computes with, on the compute device)."""

    key: str
    module: nn.Module
    name: str
    stored_nbytes: int
    compute: Callable[[], torch.Tensor]


@dataclass(frozen=True)
class BakeChoice:
    """What was chosen, with the figures it was chosen by (None where not measured)."""

    bake: bool
    mode: BakeMode
    targets: int
    stored_bytes: int
    baked_bytes: int
    patch_s: float | None  # per step, all targets, the per-forward path
    copy_gbps: float | None

    def describe(self) -> str:
        if not self.targets:
            return "bake_lora: no streamed weight carries patches"
        what = (
            f"{self.targets} patched weights, {fmt_bytes(self.stored_bytes)} quantized with "
            f"patches, {fmt_bytes(self.baked_bytes)} baked"
        )
        if self.mode != "auto":
            done = "baked once" if self.bake else "patched on every forward"
            return f"bake_lora {self.mode}: {what}; {done}"
        extra = max(0, self.baked_bytes - self.stored_bytes)
        move_s = extra / ((self.copy_gbps or 1.0) * GB)
        verdict = "baked once" if self.bake else "patched on every forward"
        return (
            f"bake_lora auto: {what}; per step the patches cost {self.patch_s or 0:.3f} s "
            f"(measured), the extra {fmt_bytes(extra)} {move_s:.3f} s at "
            f"{self.copy_gbps or 0:.1f} GB/s: {verdict}"
        )


def bake_patched(
    targets: list[BakeTarget],
    mode: BakeMode,
    copy_gbps: Callable[[], float],
    keep: Callable[[BakeTarget, torch.Tensor], None],
) -> BakeChoice:
    """Bakes ``targets`` as ``mode`` says ([Note: baking a patched weight]): each baked
    weight is handed to ``keep`` (the host puts it in the module, as a plain tensor where
    the tier keeps it, with what unpatching needs). ``copy_gbps`` is asked only by "auto"."""
    stored = sum(t.stored_nbytes for t in targets)
    if mode == "off" or not targets:
        return BakeChoice(False, mode, len(targets), stored, 0, None, None)
    done: dict[int, torch.Tensor] = {}
    patch_s: float | None = None
    gbps: float | None = None
    if mode == "auto":
        sample = sorted(range(len(targets)), key=lambda i: -targets[i].stored_nbytes)[:SAMPLE]
        spent, sampled, sampled_out = 0.0, 0, 0
        _settle(targets[sample[0]].compute())  # warm-up, untimed: first-call costs are not a step's
        for i in sample:
            t0 = time.perf_counter()
            w = targets[i].compute()
            _settle(w)
            spent += time.perf_counter() - t0
            done[i] = w
            sampled += targets[i].stored_nbytes
            sampled_out += tensor_nbytes(w)
        patch_s = spent * stored / max(1, sampled)
        baked_est = sampled_out * stored // max(1, sampled)
        gbps = copy_gbps()
        extra = max(0, baked_est - stored)
        if extra / (gbps * GB) >= patch_s:
            return BakeChoice(False, mode, len(targets), stored, baked_est, patch_s, gbps)
    baked = 0
    for i, t in enumerate(targets):
        w = done.pop(i) if i in done else t.compute()
        baked += tensor_nbytes(w)
        keep(t, w)
    return BakeChoice(True, mode, len(targets), stored, baked, patch_s, gbps)


def _settle(t: torch.Tensor) -> None:
    """Waits for ``t``'s device work, so its time is what was measured."""
    if t.device.type != "cpu" and torch.accelerator.is_available():
        torch.accelerator.synchronize(t.device)


def measure_copy_gbps(device: torch.device, nbytes: int = 64 << 20) -> float:
    """A copy from pageable host memory to ``device`` (on a CPU: RAM to RAM), timed once:
    what a step's extra bytes cost. The copy is made twice; the second is timed."""
    src = torch.empty(nbytes, dtype=torch.uint8)
    src.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        dst.copy_(src)
        _settle(dst)
        best = min(best, time.perf_counter() - t0)
    return nbytes / max(best, 1e-9) / GB
