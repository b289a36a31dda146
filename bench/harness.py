"""What every benchmark driver shares: the process each mode runs in (its environment, the job
it is given, the result it writes), the machine it runs on, and the model it runs (built once
with seeded weights, saved as a safetensors checkpoint, with its inputs).

The drivers (compare.py, paired.py, load_memory.py, ab_versions.py, h2h.py) keep only what
they measure; the tables are report.py's.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench import models

REPO = Path(__file__).resolve().parents[1]
Job = dict[str, Any]


# -- processes ---------------------------------------------------------------------------------
def worker_env() -> dict[str, str]:
    """The environment of a mode's process: the checkout first on the path (before what the
    caller's PYTHONPATH holds: on a lent GPU the carried wheels live there), torchao's native
    kernels skipped unless the caller says otherwise (the CPU wheel has none), no network for
    the peers' hubs."""
    parts = [str(REPO), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in parts if p), HF_HUB_OFFLINE="1")
    env.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    return env


def _label(job: Job) -> Job:
    """What names a job in its result: a driver's ``mode``, or the head-to-head's ``row``."""
    return {k: job[k] for k in ("mode", "row") if k in job}


def spawn(module: str, job: Job, *, python: str | None = None) -> dict[str, Any]:
    """Runs ``python -m module '<job>'`` (a fresh process whose ``__main__`` calls
    ``job_main``; ``python`` defaults to this one, the head-to-head gives each ComfyUI core's
    own) and returns the result it wrote to ``job["result_file"]``, with its outputs loaded and
    ``wall_s``; a failed process's result has its ``error`` and the ``log`` it printed last."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [python or sys.executable, "-m", module, json.dumps(job)],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
    )
    rfile = Path(job["result_file"])
    if rfile.exists():
        res: dict[str, Any] = json.loads(rfile.read_text())
    else:
        res = {**_label(job), "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    if "error" in res:
        res["log"] = (proc.stdout + proc.stderr)[-3000:]
    res["wall_s"] = time.perf_counter() - t0
    if "out_file" in res:
        res["outputs"] = torch.load(res["out_file"])
    return res


def job_main(argv: list[str], work: Callable[[Job], dict[str, Any]]) -> int:
    """A mode's process: ``argv[0]`` is the job (JSON); the result of ``work(job)``, or the
    error (its traceback also printed, so ``spawn``'s ``log`` has it), goes to
    ``job["result_file"]``."""
    job = json.loads(argv[0])
    try:
        result = work(job)
    except Exception:
        traceback.print_exc()
        result = {**_label(job), "error": traceback.format_exc(limit=8)}
    Path(job["result_file"]).write_text(json.dumps(result))
    return 0 if "error" not in result else 1


def fresh_dir(workdir: Path, mode: str) -> Path:
    """An empty folder for one mode's files."""
    mdir = workdir / mode.replace("+", "_")
    shutil.rmtree(mdir, ignore_errors=True)
    mdir.mkdir()
    return mdir


def judge(results: list[dict[str, Any]]) -> None:
    """Each result's ``equal``: its first and last outputs against the resident row's last
    (torch.equal), and ``max_diff`` where not equal; the outputs are dropped after."""
    ref = next((r for r in results if r["mode"] == "resident" and "outputs" in r), None)
    base = ref["outputs"]["last"] if ref is not None else None
    for r in results:
        if "outputs" not in r:
            continue
        if base is None:
            r["equal"] = None
            continue
        outs = (r["outputs"]["first"], r["outputs"]["last"])
        r["equal"] = all(torch.equal(o, base) for o in outs)
        if not r["equal"]:
            r["max_diff"] = max(float((o.float() - base.float()).abs().max()) for o in outs)
        del r["outputs"]


# -- the machine ---------------------------------------------------------------------------------
def machine(workdir: Path) -> dict[str, Any]:
    import psutil

    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {"torch": torch.__version__}
    for pkg in ("diffusers", "accelerate", "safetensors"):
        try:
            versions[pkg] = __import__(pkg).__version__
        except ImportError:
            versions[pkg] = "not installed"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "ram": psutil.virtual_memory().total,
        "disk": _disk_of(workdir),
        "gpu": gpu,
        "python": platform.python_version(),
        "versions": versions,
        "load": os.getloadavg(),
    }


def _disk_of(path: Path) -> str:
    try:
        dev = os.stat(path).st_dev
        major, minor = os.major(dev), os.minor(dev)
        sys_dev = Path(f"/sys/dev/block/{major}:{minor}").resolve()
        name = sys_dev.name
        queue = sys_dev / "queue" if (sys_dev / "queue").exists() else sys_dev.parent / "queue"
        rot = (queue / "rotational").read_text().strip() == "1"
        fs = "?"
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if parts[0].endswith(name):
                fs = parts[2]
        return f"/dev/{name} ({fs}, rotational={int(rot)})"
    except OSError:
        return "?"


# -- the model -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prepared:
    """A model written for a run: its checkpoint and one forward's inputs."""

    checkpoint: Path
    inputs: dict[str, Any]
    input_spec: models.InputSpec
    nbytes: int  # the weights' bytes
    params: int


def prepare(
    spec: models.ModelSpec,
    checkpoint: Path,
    inputs: models.InputSpec | Callable[[torch.nn.Module], models.InputSpec],
) -> Prepared:
    """Builds the model (seeded weights), saves it at ``checkpoint`` and makes its inputs
    (``inputs`` may choose them from the built model: compare.py's calibration)."""
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    built = models.build_model(spec)
    nbytes = models.param_bytes(built)
    params = sum(p.numel() for p in built.parameters())
    models.save_checkpoint(built, checkpoint)
    inp = inputs if isinstance(inputs, models.InputSpec) else inputs(built)
    x = models.make_inputs(spec, inp, built)
    return Prepared(checkpoint, x, inp, nbytes, params)
