"""Running a command under a cgroup v1 memory limit (root only), for the memory-bound tests.

A process over the limit is killed by the kernel (-9); page cache counts toward the limit but
is reclaimed first, so only memory a process cannot give back kills it (facts.md).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/memory")


def unavailable() -> str | None:
    """Why a memory limit cannot be set here (None: it can)."""
    if not (ROOT / "cgroup.procs").exists():
        return f"no cgroup v1 memory controller at {ROOT}"
    if not os.access(ROOT, os.W_OK):
        return f"{ROOT} is not writable (run as root to test memory bounds)"
    return None


@dataclass
class LimitedRun:
    returncode: int
    max_usage: int  # the cgroup's peak (process memory + page cache), bytes
    stdout: str
    stderr: str

    @property
    def killed(self) -> bool:
        return self.returncode == -9


class MemoryGroup:
    """A fresh memory cgroup of ``limit_bytes``; ``enter`` is a ``preexec_fn`` that puts the
    child in it before exec, so everything the child does is counted."""

    def __init__(self, limit_bytes: int, name: str = "ferry-test") -> None:
        self.path = ROOT / f"{name}-{uuid.uuid4().hex[:10]}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        self.limit = limit_bytes
        self._procs = str(self.path / "cgroup.procs")

    def enter(self) -> None:
        with open(self._procs, "w") as f:
            f.write(str(os.getpid()))

    @property
    def max_usage(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def reset_peak(self) -> None:
        """Starts ``max_usage`` again from the usage now (a peak per step)."""
        (self.path / "memory.max_usage_in_bytes").write_text("0")

    def remove(self) -> None:
        """After every process in it has exited."""
        self.path.rmdir()


def run_limited(
    cmd: list[str], limit_bytes: int, timeout: float = 600, env: dict[str, str] | None = None
) -> LimitedRun:
    """Runs ``cmd`` inside a fresh memory cgroup of ``limit_bytes``, from its first instruction."""
    group = MemoryGroup(limit_bytes)
    try:
        p = subprocess.run(
            cmd, preexec_fn=group.enter, capture_output=True, text=True, timeout=timeout, env=env
        )
        return LimitedRun(p.returncode, group.max_usage, p.stdout, p.stderr)
    finally:
        group.remove()
