"""Every disk-tier group holds one or two open files; a leaf-level offload of a large model
has hundreds of groups, and many desktops start programs with a soft limit of 1024 open files.
Ferry raises the soft limit (up to the hard one) before it writes anything (disk/posix.py:
reserve_descriptors), and past the hard limit says what to change, the model left as it was.
Each case runs in a child process with its own limits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

resource = pytest.importorskip("resource")
# Windows has no soft limit to raise (its C runtime allows 8192 descriptors: test_platform.py).
pytestmark = pytest.mark.skipif(
    os.environ.get("FERRY_PLATFORM_STANDIN") == "windows",
    reason="Windows (stand-in) has no open-file soft limit",
)

SCRIPT = r"""
import json, resource, sys, torch
from offload_core import DiskTier, LeafLevel, OffloadPolicy, apply_offload
from offload_core.errors import ConfigError
from tests.helpers import make_model, reference, snapshot, state_equal

soft, hard = int(sys.argv[2]), int(sys.argv[3])
x, ref = reference("fp32")
model = make_model("fp32")
before = snapshot(model)[0]
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
policy = OffloadPolicy(level=LeafLevel(), tier=DiskTier(sys.argv[1], cpu_read="copy"))
out = {}
try:
    handle = apply_offload(model, policy, onload_device="cpu")
except ConfigError as e:
    out["error"] = str(e)
    out["intact"] = state_equal(before, snapshot(model)[0])
    with torch.no_grad():
        out["equal"] = torch.equal(model(**x), ref)
else:
    with torch.no_grad():
        out["equal"] = all(torch.equal(model(**x), ref) for _ in range(2))
    out["groups"] = handle.stats().groups
    handle.remove()
out["soft_after"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
print(json.dumps(out))
"""


def run(tmp_path: Path, soft: int, hard: int) -> dict:  # type: ignore[type-arg]
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "ferry"), str(soft), str(hard)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_low_soft_limit_is_raised_and_the_offload_runs(tmp_path: Path) -> None:
    out = run(tmp_path, soft=48, hard=4096)
    assert out["groups"] * 2 > 48, "the model must need more descriptors than the soft limit"
    assert out["equal"] is True
    assert 48 < out["soft_after"] <= 4096


def test_past_the_hard_limit_the_error_says_what_to_change_and_the_model_is_intact(
    tmp_path: Path,
) -> None:
    out = run(tmp_path, soft=48, hard=48)
    assert "ulimit -n" in out["error"] and "block level" in out["error"]
    assert out["error"].startswith("level:") or "level" in out["error"]
    assert out["intact"] is True and out["equal"] is True
    assert not list((tmp_path / "ferry").rglob("group-*.safetensors")), "no files left behind"
