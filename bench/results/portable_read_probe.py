"""Issue 22 probe: one cold buffered read of a file in group-sized requests, by backend
(PosixFiles.pread = os.preadv, PortableFiles.pread = lseek + readinto under its lock) and by
destination (host_buffer on transparent huge pages, as the preadv backend's ring is on Linux;
page-aligned torch.empty memory, as the portable backend's ring is). Rounds shuffled.

    PYTHONPATH=. .venv-bench/bin/python bench/results/portable_read_probe.py FILE [ROUNDS] [REQUEST_MIB]

(Linux only: it needs both backends and posix_fadvise.)
"""

import os
import random
import statistics
import sys
import time
from pathlib import Path

from bench.probes import drop_page_cache
from bench.report import md_table
from offload_core.disk import host_memory
from offload_core.disk.files import FileBackend
from offload_core.disk.portable import PortableFiles
from offload_core.disk.posix import PosixFiles
from offload_core.formats.safetensors import byte_view
from offload_core.units import GB, fmt_bytes

path = Path(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
request = (int(sys.argv[3]) if len(sys.argv) > 3 else 256) << 20
size = os.path.getsize(path)
backends: dict[str, FileBackend] = {"preadv": PosixFiles(), "seek+readinto": PortableFiles()}
dests = {
    "huge pages": host_memory._huge_page_buffer(request),
    "torch.empty pages": host_memory._page_aligned(request),
}
for slot in dests.values():
    slot.fill_(1)  # touched once, as a ring slot is after its first read
variants = [(b, d) for b in backends for d in dests]
rates: dict[tuple[str, str], list[float]] = {v: [] for v in variants}


for r in range(rounds):
    order = variants[:]
    random.shuffle(order)
    for b, d in order:
        backend, buf = backends[b], dests[d]
        mv = byte_view(buf)
        drop_page_cache([path])
        fd = backend.open(path)
        t0 = time.perf_counter()
        off = 0
        while off < size:
            n = backend.pread(fd, mv[: min(request, size - off)], off)
            if n == 0:
                break
            off += n
        dt = time.perf_counter() - t0
        os.close(fd)
        rates[(b, d)].append(size / dt / GB)
    print(
        f"round {r + 1}: "
        + ", ".join(f"{b} into {d} {rates[(b, d)][-1]:.2f}" for b, d in variants),
        flush=True,
    )
print(
    f"{fmt_bytes(size)} in {fmt_bytes(request)} requests, cold, buffered, {rounds} rounds (GB/s):"
)
rows = []
for b, d in variants:
    x = rates[(b, d)]
    rows.append((b, d, f"{statistics.median(x):.2f}", f"{min(x):.2f}-{max(x):.2f}"))
print(md_table(("backend", "destination", "median GB/s", "range"), rows))
