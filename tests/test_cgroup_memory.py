"""The RAM a process in a memory cgroup can still take (runtime/cgroup_memory.py).

Parsed from files laid out as the kernel lays them out (v1 and v2), and read for real from
inside a cgroup v1 limit where the machine lets the tests set one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from offload_core.runtime.cgroup_memory import cgroup_available
from tests import cgroup_limit

MB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_v1_limit_minus_usage_plus_inactive_file(tmp_path: Path) -> None:
    _write(tmp_path, {
        "proc": "5:cpu:/\n4:memory:/pod/a\n0::/\n",
        "memory/pod/a/memory.limit_in_bytes": f"{2048 * MB}\n",
        "memory/pod/a/memory.usage_in_bytes": f"{1500 * MB}\n",
        "memory/pod/a/memory.stat": f"cache 1\ntotal_inactive_file {100 * MB}\n",
    })  # fmt: skip
    assert cgroup_available(tmp_path, tmp_path / "proc") == 648 * MB


def test_v2_max_minus_current_plus_inactive_file(tmp_path: Path) -> None:
    _write(tmp_path, {
        "proc": "0::/user.slice/app\n",
        "user.slice/app/memory.max": f"{1024 * MB}\n",
        "user.slice/app/memory.current": f"{1100 * MB}\n",
        "user.slice/app/memory.stat": f"anon 5\ninactive_file {10 * MB}\n",
    })  # fmt: skip
    assert cgroup_available(tmp_path, tmp_path / "proc") == 0  # over the limit: nothing left


@pytest.mark.parametrize(
    "files",
    [
        {"proc": "0::/x\n", "x/memory.max": "max\n", "x/memory.current": "5\n"},
        {
            "proc": "4:memory:/\n",
            "memory/memory.limit_in_bytes": f"{(1 << 63) - 4096}\n",
            "memory/memory.usage_in_bytes": "5\n",
        },
        {"proc": "4:memory:/gone\n"},  # the path is another namespace's: no files here
    ],
    ids=["v2-max", "v1-unlimited", "v1-unreadable"],
)
def test_no_limit_is_none(tmp_path: Path, files: dict[str, str]) -> None:
    _write(tmp_path, files)
    assert cgroup_available(tmp_path, tmp_path / "proc") is None


@pytest.mark.skipif(cgroup_limit.unavailable() is not None, reason=str(cgroup_limit.unavailable()))
def test_inside_a_real_limit_the_limit_is_what_is_available() -> None:
    code = "from offload_core.runtime.memory import system_available_ram as a; print(a())"
    run = cgroup_limit.run_limited(
        [sys.executable, "-c", code], 600 * MB, env={"PYTHONPATH": str(REPO)}
    )
    assert run.returncode == 0, run.stderr[-2000:]
    available = int(run.stdout.split()[-1])
    assert 100 * MB < available < 600 * MB  # the host has gigabytes more
