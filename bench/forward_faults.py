"""What a forward costs the host beside its compute, counted rather than timed (a shared
machine moves wall times 2x within a run; page faults do not move): per forward of one
offloaded model, the heap trims it made (counted on ``runtime/memory.trim_heap``), the minor
page faults and CPU seconds of the process (``getrusage``), and RssAnon after it (issue 47).

    PYTHONPATH=. python -m bench.forward_faults --model flux --tokens 1024 --txt-tokens 256

Run it from each engine's tree to compare them; the model is the paired bench's.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import torch

from bench import harness, models, modes, report
from offload_core.runtime import memory
from offload_core.units import fmt_bytes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["flux", "dit"], default="flux")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--txt-tokens", type=int, default=256)
    p.add_argument("--mode", default="ferry-block-disk")
    p.add_argument("--forwards", type=int, default=2)
    p.add_argument("--workdir", default="/tmp/ferry-bench-faults")
    a = p.parse_args(argv)
    if not modes.valid(a.mode):
        p.error(f"unknown mode {a.mode}; see python -m bench.compare --help")
    trims = [0]
    real_trim = memory.trim_heap

    def counted() -> None:
        trims[0] += 1
        real_trim()

    memory.trim_heap = counted  # every trim, the engine's and a layout's, goes through it
    spec = models.ModelSpec(a.model)
    work = Path(a.workdir).resolve()
    prep = harness.prepare(
        spec, work / "faults-model.safetensors", models.InputSpec(a.tokens, a.txt_tokens)
    )
    model = models.load_model(spec, prep.checkpoint)
    modes.apply_mode(a.mode, model, torch.device("cpu"), work, prep.checkpoint, {})
    rows = []
    with torch.no_grad():
        for i in range(a.forwards):
            trims[0] = 0
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            models.forward(model, prep.inputs)
            r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            rows.append([
                str(i + 1), str(trims[0]), str(r1.ru_minflt - r0.ru_minflt),
                f"{r1.ru_utime - r0.ru_utime:.2f}", f"{r1.ru_stime - r0.ru_stime:.2f}",
                f"{t1 - t0:.2f}", fmt_bytes(memory.process_memory().rss_anon),
            ])  # fmt: skip
    head = ["forward", "heap trims", "minor faults", "user s", "sys s", "wall s", "RssAnon"]
    print(f"{spec.label}; {a.tokens} + {a.txt_tokens} tokens; {a.mode}\n")
    print(report.md_table(head, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
