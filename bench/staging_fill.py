"""The RAM tier's host side ([Note: the RAM tier through staging] in transfer/copies.py): how
fast the reader's threads fill a staging buffer from a group's slab in pageable RAM
(``Reader.copy_in``), against one ``memcpy`` of the same bytes (``ctypes.memmove``, and
``torch.Tensor.copy_``). Buffers are made and touched once, then reused, as the staging ring
is; on a machine with CUDA the staging buffers are pinned (``--pin``), as Ferry's are.

    .venv/bin/python -m bench.staging_fill --group-mib 64,256 --threads 1,2,4 --reps 9
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import statistics
import time
from collections.abc import Callable

import torch

from offload_core.disk.host_memory import host_buffer
from offload_core.disk.reader import Reader
from offload_core.units import GB


class _Clock:
    def read_started(self) -> None: ...
    def read_finished(self, nbytes: int) -> None: ...


def _gbps(nbytes: int, reps: int, fill: Callable[[], None]) -> float:
    fill()  # warm: pages touched, threads started
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fill()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / GB


def row(mib: int, threads: list[int], reps: int, pin: bool) -> list[str]:
    """One group size: its cells."""
    n = mib << 20
    slab = host_buffer(n)
    slab.fill_(7)
    staging = host_buffer(n)
    if pin:
        staging = staging.pin_memory()
    staging.zero_()
    dst, src = staging.data_ptr(), slab.data_ptr()
    one = _gbps(n, reps, lambda: ctypes.memmove(dst, src, n))
    tc = _gbps(n, reps, lambda: staging.copy_(slab))
    cells = [f"{mib} MiB", f"{one:.2f}", f"{tc:.2f}"]
    for t in threads:
        reader = Reader(_Clock(), t)
        try:
            g = _gbps(n, reps, functools.partial(reader.copy_in, slab, staging, n))
        finally:
            reader.close()
        cells.append(f"{g:.2f} ({g / one:.2f})")
    assert torch.equal(staging, slab)
    return cells


def run(group_mib: list[int], threads: list[int], reps: int, pin: bool) -> list[str]:
    lines = [
        "| group | one memcpy GB/s | torch copy_ GB/s | "
        + " | ".join(f"copy_in x{t} GB/s (x memcpy)" for t in threads)
        + " |",
        "|---|---|---|" + "---|" * len(threads),
    ]
    for mib in group_mib:
        lines.append("| " + " | ".join(row(mib, threads, reps, pin)) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--group-mib", default="64,256")
    ap.add_argument("--threads", default="1,2,4")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--pin", action="store_true", help="pin the staging buffers (needs CUDA)")
    args = ap.parse_args()
    pin = args.pin and torch.cuda.is_available()
    print(
        f"staging fill: torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"staging {'pinned' if pin else 'pageable (no CUDA: pinning needs it)'}"
    )
    lines = run(
        [int(x) for x in args.group_mib.split(",")],
        [int(x) for x in args.threads.split(",")],
        args.reps,
        pin,
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
