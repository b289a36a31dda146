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


def run_limited(
    cmd: list[str], limit_bytes: int, timeout: float = 600, env: dict[str, str] | None = None
) -> LimitedRun:
    """Runs ``cmd`` inside a fresh memory cgroup of ``limit_bytes``, from its first instruction."""
    group = ROOT / f"ferry-test-{uuid.uuid4().hex[:10]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
        procs = str(group / "cgroup.procs")

        def enter() -> None:  # in the child, before exec: everything it does is counted
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        p = subprocess.run(
            cmd, preexec_fn=enter, capture_output=True, text=True, timeout=timeout, env=env
        )
        peak = int((group / "memory.max_usage_in_bytes").read_text())
        return LimitedRun(p.returncode, peak, p.stdout, p.stderr)
    finally:
        group.rmdir()
