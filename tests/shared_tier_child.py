"""The other processes of tests/test_shared_tier.py: started with multiprocessing's spawn (a
fresh interpreter, as a second ComfyUI server is), so they live in a module the child imports
by name."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import torch

from offload_core import OffloadPolicy, SharedRamTier, apply_offload
from offload_core.disk import shared_segments
from offload_core.disk.shared_segments import SEGMENT
from offload_core.model.demo import build_demo_model, demo_inputs
from offload_core.sources.shared_slab import SharedSlabSource

SIZE = 0.004  # the demo DiT's size (GB): a few MiB, a dozen groups


def model_for(seed: int = 1, lora: float = 0.0) -> torch.nn.Module:
    model = build_demo_model(SIZE, torch.float32, seed=seed)
    if lora:  # a LoRA baked into one block: its weights changed, the others not
        block = next(m for n, m in model.named_modules() if n.endswith("blocks.1"))
        with torch.no_grad():
            for p in block.parameters():
                p.add_(lora)
    return model


def sources_of(handle: Any) -> list[SharedSlabSource]:
    return [rt.source for rt in handle._placement.streamed]


def mapped_segments(pid: int) -> set[tuple[int, str]]:
    """(inode, name) of every segment process ``pid`` maps now."""
    out = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5].endswith(SEGMENT):
            out.add((int(parts[4]), Path(parts[5]).name))
    return out


def holder(conn: Any, seed: int, lora: float) -> None:
    """A Ferry process: lays the demo network out on the shared tier, says what it maps,
    then does what it is told ("forward": its output equals its resident one; "remove")."""
    model = model_for(seed, lora)
    x = demo_inputs(model, tokens=8)
    with torch.no_grad():
        ref = model(**x)
    handle = apply_offload(model, OffloadPolicy(tier=SharedRamTier()), onload_device="cpu")
    srcs = sources_of(handle)
    conn.send(
        {
            "keys": [s.held.key for s in srcs],
            "made": [s.held.made for s in srcs],
            "others": max(s.held.others for s in srcs),
            "mapped": mapped_segments(os.getpid()),
        }
    )
    while True:
        cmd = conn.recv()
        if cmd == "forward":
            with torch.no_grad():
                conn.send(torch.equal(model(**x), ref))
        elif cmd == "remove":
            handle.remove()
            conn.send(True)
        else:
            return


def die_mid_fill(root: str, n: int) -> None:
    """A writer killed half-way through a segment."""
    os.environ["FERRY_SHARED_DIR"] = root
    real = shared_segments._write_all

    def half_then_die(fd: int, data: memoryview) -> None:
        real(fd, data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)

    shared_segments._write_all = half_then_die  # type: ignore[assignment]
    shared_segments.namespace().hold(torch.arange(n, dtype=torch.float32))


def hold_file(conn: Any, path: str) -> None:
    from safetensors.torch import load_file

    held = shared_segments.namespace().hold(load_file(path)["w"])
    conn.send(held.key)
    conn.recv()
