"""The shared RAM tier in real ComfyUI (issue 49): several servers on one machine, each with the
same ~2.4 GB MMDiT (make_big_model.py, depth 16, float32) through Ferry's loader -> Ferry Offload
Model (tier shared) -> KSampler, hold one copy of its weights between them:

- two, then four servers: each latent ``torch.equal`` to the plain graph's (UNETLoader ->
  KSampler); the sum of the servers' Pss (/proc/<pid>/smaps_rollup: a shared page counts
  1/n in each of the n processes mapping it) and the segments' bytes printed as a table
  (docs/benchmarks.md);
- kill -9 of one server mid-prompt: the others' next prompts finish equal;
- after all stop (SIGINT, as Ctrl-C), nothing is left in the shared namespace; a crash's
  leftovers (every holder killed with -9) are swept by the next server's first layout;
- two servers inside one memory cgroup smaller than two copies run where two plain servers
  are killed.

The servers run one prompt at a time (memory is shared with other work here), each in its
own base folder over one models folder, with a private namespace (FERRY_SHARED_DIR).

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_shared_tier.py -s
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    HERE,
    REPO,
    Server,
    comfy_checkout,
    make_base,
    run_maker,
    start_server,
)
from ferry_workflows import Client, error_message, ferry, graph, saved_latent_name
from make_big_model import MODEL_FILE
from safetensors.torch import load_file

from tests import cgroup_limit

MB = 1 << 20
DEPTH = 16  # hidden 1024: a ~2.4 GB float32 file
STEPS = 2


def _graph(shared: bool, prefix: str, steps: int = STEPS) -> dict[str, Any]:
    if not shared:
        loader = ("UNETLoader", {"unet_name": MODEL_FILE, "weight_dtype": "default"})
        return graph([], prefix, loader=loader, steps=steps)
    inputs = {"unet_name": MODEL_FILE, "quant_preset": "none", "cache": False}
    loader = ("FerryLoadDiffusionModelQuantized", {**inputs, "weight_dtype": "default"})
    return graph([ferry(tier="shared", blocks_per_group=2)], prefix, loader=loader, steps=steps)


def _latent(srv: Server, g: dict[str, Any], timeout: float = 900) -> torch.Tensor:
    entry = Client(srv.url).run(g, timeout=timeout)
    assert entry["status"]["status_str"] == "success", f"{error_message(entry)}\n{srv.log_tail()}"
    return load_file(str(srv.base / "output" / saved_latent_name(entry)))["latent_tensor"]


def _pss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no Pss for {pid}")


def _segments(ns: Path) -> list[Path]:
    return sorted(ns.glob("*.seg"))


def _stop(srv: Server, how: int = signal.SIGINT) -> None:
    """Ctrl-C: ComfyUI exits through Python's exit path, so Ferry lets its segments go."""
    if srv.proc.poll() is None:
        srv.proc.send_signal(how)
        try:
            srv.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-shared-models")
    make_base(base, py, comfy)
    run_maker(base, py, comfy, "make_big_model.py", str(DEPTH), timeout=900)
    size = (base / "models" / "diffusion_models" / MODEL_FILE).stat().st_size
    assert size > 2200 * MB, size
    return base / "models"


@pytest.fixture
def namespace(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private shared namespace, in RAM as the tier's own is; the servers find it through
    the environment start_server hands them."""
    ns = Path("/dev/shm") / f"ferry-test-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("FERRY_SHARED_DIR", str(ns))
    yield ns
    shutil.rmtree(ns, ignore_errors=True)


def _base(tmp: Path, models: Path, name: str) -> Path:
    """A server's own base folder (its output, database, log) over the shared models."""
    base = tmp / name
    (base / "custom_nodes").mkdir(parents=True)
    (base / "custom_nodes" / "ComfyUI-Ferry").symlink_to(REPO, target_is_directory=True)
    for pack in ("ferry_test_nodes.py", "ferry_standin_nodes.py"):
        shutil.copy(HERE / pack, base / "custom_nodes" / pack)
    (base / "models").symlink_to(models, target_is_directory=True)
    return base


def _servers(tmp: Path, models: Path, n: int, tag: str, **kw: Any) -> list[Server]:
    comfy, py = comfy_checkout()
    return [start_server(comfy, py, _base(tmp, models, f"{tag}-{i}"), **kw) for i in range(n)]


@pytest.fixture(scope="module")
def plain(models: Path, tmp_path_factory: pytest.TempPathFactory) -> torch.Tensor:
    (srv,) = _servers(tmp_path_factory.mktemp("plain"), models, 1, "plain")
    try:
        return _latent(srv, _graph(False, "plain"))
    finally:
        _stop(srv)


def test_servers_share_one_copy(
    models: Path, plain: torch.Tensor, namespace: Path, tmp_path: Path
) -> None:
    file_size = (models / "diffusion_models" / MODEL_FILE).stat().st_size
    rows = []
    for n in (2, 4):
        servers = _servers(tmp_path, models, n, f"n{n}")
        try:
            for i, srv in enumerate(servers):  # one prompt at a time: one load's peak at once
                assert torch.equal(_latent(srv, _graph(True, f"shared-{n}-{i}")), plain)
            live = [o for srv in servers for o in Client(srv.url).live()]
            assert len(live) == n and all(o.get("tier") == "shared" for o in live), live
            pss = sum(_pss(srv.proc.pid) for srv in servers)
            seg = sum(p.stat().st_size for p in _segments(namespace))
            rows.append((n, pss, seg))
            assert seg <= 1.1 * file_size, "more than one copy in the namespace"
            # One copy of the weights plus each server's own (ComfyUI, torch, the slots):
            # far from n copies.
            assert pss < seg + n * 1200 * MB, (pss, seg)
            log = servers[-1].log.read_text(errors="replace")
            assert f"shared with {n - 1} other process" in log, log[-3000:]
        finally:
            for srv in servers:
                _stop(srv)
        assert list(namespace.iterdir()) == [], list(namespace.iterdir())
    print(f"\nmodel file {file_size / MB:.0f} MB")
    print("| servers | sum of Pss (MB) | segments (MB) | n copies of the file (MB) |")
    for n, pss, seg in rows:
        print(f"| {n} | {pss / MB:.0f} | {seg / MB:.0f} | {n * file_size / MB:.0f} |")


def test_kill9_mid_prompt_and_crash_leftovers(
    models: Path, plain: torch.Tensor, namespace: Path, tmp_path: Path
) -> None:
    a, b = _servers(tmp_path, models, 2, "kill")
    try:
        assert torch.equal(_latent(a, _graph(True, "a-first")), plain)
        assert torch.equal(_latent(b, _graph(True, "b-first")), plain)
        status, body = Client(a.url).queue(_graph(True, "a-killed", steps=40))
        assert status == 200, body
        time.sleep(8)  # inside the sampler's steps (each reads every group)
        a.proc.kill()
        a.proc.wait()
        assert torch.equal(_latent(b, _graph(True, "b-after", steps=STEPS + 1)), _b_ref(models))
        assert _segments(namespace), "b's segments went with a"
        b.proc.kill()  # every holder killed: the segments are a crash's leftovers now
        b.proc.wait()
        left = _segments(namespace)
        assert left
        (c,) = _servers(tmp_path, models, 1, "next")
        try:
            assert torch.equal(_latent(c, _graph(True, "c")), plain)
            assert "shared with 0 other process" in c.log.read_text(errors="replace")
        finally:
            _stop(c)
    finally:
        for srv in (a, b):
            _stop(srv)
    assert list(namespace.iterdir()) == [], list(namespace.iterdir())


_REFS: dict[int, torch.Tensor] = {}


def _b_ref(models: Path) -> torch.Tensor:
    """The plain graph with one more step (a prompt ComfyUI does not answer from its cache)."""
    if STEPS + 1 not in _REFS:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            (srv,) = _servers(Path(tmp), models, 1, "plain3")
            try:
                _REFS[STEPS + 1] = _latent(srv, _graph(False, "plain3", steps=STEPS + 1))
            finally:
                _stop(srv)
    return _REFS[STEPS + 1]


@pytest.mark.skipif(cgroup_limit.unavailable() is not None, reason=str(cgroup_limit.unavailable()))
def test_two_servers_in_a_cgroup_smaller_than_two_copies(
    models: Path, plain: torch.Tensor, namespace: Path, tmp_path: Path
) -> None:
    file_size = (models / "diffusion_models" / MODEL_FILE).stat().st_size
    limit = int(1.5 * file_size) + 1200 * MB  # one copy, and two servers' own memory
    assert limit < 2 * file_size + 600 * MB
    for shared in (True, False):
        group = cgroup_limit.MemoryGroup(limit, name="ferry-49-shared")
        servers = _servers(tmp_path, models, 2, f"cg-{shared}", preexec_fn=group.enter)
        try:
            outcomes = []
            for i, srv in enumerate(servers):
                try:
                    got = _latent(srv, _graph(shared, f"cg-{shared}-{i}"), timeout=600)
                    outcomes.append(torch.equal(got, plain))
                except (AssertionError, OSError) as e:
                    outcomes.append(f"failed: {str(e)[:200]}")
            killed = [srv.proc.poll() == -signal.SIGKILL for srv in servers]
            print(
                f"\n{'shared' if shared else 'plain'}: limit {limit / MB:.0f} MB, cgroup peak "
                f"{group.max_usage / MB:.0f} MB, outcomes {outcomes}, killed {killed}"
            )
            if shared:
                assert outcomes == [True, True] and not any(killed)
            else:
                assert any(killed), "two plain servers ran inside the limit: it proves nothing"
        finally:
            for srv in servers:
                _stop(srv)
            group.remove()
    assert list(namespace.iterdir()) == [], list(namespace.iterdir())
