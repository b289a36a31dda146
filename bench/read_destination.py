"""Where an O_DIRECT read lands changes how fast the disk delivers it: cold reads of one file
in large requests (a block-level group each) into differently made host memory, in shuffled
order per round, median GB/s. [Note: where a direct read lands] (offload_core/disk/
host_memory.py) says why.

    python -m bench.read_destination [--size-gb 2.5] [--request-mb 340] [--rounds 5]
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.probes import drop_page_cache
from bench.report import md_table
from offload_core.disk.host_memory import _page_aligned, host_buffer
from offload_core.units import GB, GIB, MIB, fmt_bytes


def _destinations(request: int) -> dict[str, memoryview]:
    filled = _page_aligned(request)
    filled.fill_(1)  # torch fills with its thread pool: pages faulted by several threads
    shared = mmap.mmap(-1, 64 * MIB)  # the benchmark's raw read: one reused 64 MiB buffer
    shared.write(b"\0" * len(shared))

    def view(t: torch.Tensor) -> memoryview:
        return memoryview(t.numpy()).cast("B")  # type: ignore[arg-type]

    return {
        "torch.empty, filled by torch (Ferry's ring before)": view(filled),
        "torch.empty, first touched by the read": view(_page_aligned(request)),
        "host_buffer: huge pages, populated (Ferry's ring now)": view(host_buffer(request)),
        "one reused 64 MiB buffer, 64 MiB requests (the raw read)": memoryview(shared),
    }


def _reader(path: Path, size: int, request: int, dest: memoryview) -> Callable[[], None]:
    step = min(request, len(dest))

    def read() -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            for off in range(0, size, step):
                n = min(step, size - off)
                got = 0
                while got < n:
                    got += os.preadv(fd, [dest[got:n]], off + got)
        finally:
            os.close(fd)

    return read


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.read_destination")
    p.add_argument("--size-gb", type=float, default=2.5, help="GiB")
    p.add_argument("--request-mb", type=int, default=340, help="one block-level group")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dir", default=os.environ.get("FERRY_BENCH_DIR", "/tmp/ferry-bench"))
    a = p.parse_args(argv)
    request = a.request_mb * MIB
    size = int(a.size_gb * GIB) // request * request
    folder = Path(a.dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "destination-probe.bin"
    block = os.urandom(16 * MIB)
    with open(path, "wb") as f:
        for _ in range(size // len(block) + 1):
            f.write(block)
        os.fsync(f.fileno())
    try:
        reads = {k: _reader(path, size, request, d) for k, d in _destinations(request).items()}
        rates: dict[str, list[float]] = {k: [] for k in reads}
        for _ in range(a.rounds):
            for name in random.sample(list(reads), len(reads)):
                drop_page_cache([path])
                t0 = time.perf_counter()
                reads[name]()
                rates[name].append(size / (time.perf_counter() - t0) / GB)
    finally:
        path.unlink()
    print(f"cold O_DIRECT reads of {fmt_bytes(size)} in {a.request_mb} MiB requests, "
          f"{a.rounds} rounds (shuffled), median GB/s")  # fmt: skip
    rows = [
        (name, f"{statistics.median(r):.2f}", f"{min(r):.2f}-{max(r):.2f}")
        for name, r in rates.items()
    ]
    print(md_table(("destination", "GB/s, median", "range"), rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
