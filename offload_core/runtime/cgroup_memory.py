"""The RAM a process in a memory cgroup can still take: a container's limit, not the host's.

psutil's "available" reads /proc/meminfo, which in a container (Docker, a ComfyUI cloud pod,
the tests' cgroups) describes the host: a 2 GB-limited container on a 64 GB host would plan
as if it had 60 GB and be killed. ``cgroup_available`` reads the process's own cgroup, v2
(``memory.max`` - ``memory.current``) or v1 (``memory.limit_in_bytes`` -
``memory.usage_in_bytes``), and counts inactive file pages back as available, since the
kernel reclaims them before it kills (as Docker's own "available" figure does).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
#: v1 reports "no limit" as a page-rounded 2**63 - 1; anything near it is no limit.
UNLIMITED = 1 << 60


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _own_groups(proc_cgroup: Path) -> tuple[str | None, str | None]:
    """The process's (v1 memory controller, v2 unified) cgroup paths."""
    v1 = v2 = None
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v1, v2


def cgroup_available(
    root: Path = ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")
) -> int | None:
    """Bytes this process's memory cgroup can still give; None where no limit is set."""
    v1, v2 = _own_groups(proc_cgroup)
    if v1 is not None:
        d = root / "memory" / v1.lstrip("/")
        limit = _read_int(d / "memory.limit_in_bytes")
        used = _read_int(d / "memory.usage_in_bytes")
        if limit is not None and used is not None and limit < UNLIMITED:
            return max(0, limit - used + _stat(d / "memory.stat", "total_inactive_file"))
    if v2 is not None:
        d = root / v2.lstrip("/")
        limit = _read_int(d / "memory.max")
        used = _read_int(d / "memory.current")
        if limit is not None and used is not None:
            return max(0, limit - used + _stat(d / "memory.stat", "inactive_file"))
    return None
