"""How the disk tier's read path spends time and CPU on this machine: one cold read of a
file per variant (threads, chunk size, CRC32 check, O_DIRECT), wall GB/s and CPU seconds per
GiB read. On a CPU-only machine the CPU a read takes is taken from compute, so it is what decides
whether reads can hide behind a forward.

    python -m bench.disk_read [--size-gb 1] [--dir /tmp/ferry-bench]
    python -m bench.disk_read --beside-compute [--size-gb 2.4] [--rounds 5]

``--beside-compute`` measures what a read costs the compute running beside it, with no
offloader involved: rounds of the same matmuls (1280 tokens x 32 weights of 3072 x 3072,
fp32) alone, then with one cold read of the file on a second thread, by Ferry's two CPU read
paths (O_DIRECT preadv into a reused buffer; MADV_POPULATE_READ of a mapping, dropped after).
"""

from __future__ import annotations

import argparse
import mmap
import os
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.probes import drop_page_cache
from bench.report import md_table
from offload_core.disk.posix import MADV_POPULATE_READ
from offload_core.units import GB, GIB, MIB, fmt_bytes


def _read(path: Path, threads: int, chunk: int, crc: bool, direct: bool, size: int) -> None:
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags)
    # One reused, page-aligned buffer per thread (mmap gives page alignment for O_DIRECT).
    bufs = [mmap.mmap(-1, chunk) for _ in range(threads)]
    for b in bufs:
        b.write(b"\0" * chunk)  # pre-fault, as a reused buffer would be

    def part(k: int) -> None:
        mv = memoryview(bufs[k])
        for off in range(k * chunk, size, threads * chunk):
            n = os.preadv(fd, [mv], off)
            if crc:
                zlib.crc32(mv[:n])

    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(part, range(threads)))
    finally:
        os.close(fd)


def _populate(path: Path, size: int, chunk: int = 340 * MIB) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
        for off in range(0, size, chunk):
            n = min(chunk, size - off)
            mm.madvise(MADV_POPULATE_READ, off, n)
            mm.madvise(mmap.MADV_DONTNEED, off, n)
        mm.close()
    finally:
        os.close(fd)


def beside_compute(path: Path, size: int, rounds: int) -> None:
    import statistics
    import threading

    import torch

    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(3072, 3072, generator=gen) for _ in range(16)] * 2
    x = torch.randn(1280, 3072, generator=gen)

    def compute() -> float:
        t0 = time.perf_counter()
        for w in weights:
            x @ w.T
        return time.perf_counter() - t0

    reads = {
        "O_DIRECT, 4 threads x 16 MIB (Ferry, cpu_read='copy')": lambda: _read(
            path, 4, 16 * MIB, False, True, size
        ),
        "MADV_POPULATE_READ, 340 MB at a time (Ferry, cpu_read='mapped')": lambda: _populate(
            path, size
        ),
    }
    compute()  # warm up the matmul kernels
    print(f"compute beside a cold read of {fmt_bytes(size)}, {rounds} rounds, median")
    head = (
        "read beside compute",
        "compute alone s",
        "with the read s",
        "slowdown",
        "s lost per GiB",
    )
    rows = []
    for name, read in reads.items():
        alone, beside = [], []
        for _ in range(rounds):
            alone.append(compute())
            drop_page_cache([path])
            t = threading.Thread(target=read)
            t.start()
            beside.append(compute())
            t.join()
        ratio = statistics.median(b / a for a, b in zip(alone, beside))
        lost = statistics.median(b - a for a, b in zip(alone, beside))
        rows.append(
            (name, f"{statistics.median(alone):.3f}", f"{statistics.median(beside):.3f}",
             f"{ratio:.3f}", f"{lost / (size / GIB):.3f}")
        )  # fmt: skip
        print(f"  {name}: {ratio:.3f} x", flush=True)
    print(md_table(head, rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.disk_read", description=__doc__.split("\n")[0]
    )
    p.add_argument("--size-gb", type=float, default=1.0, help="GiB")
    p.add_argument("--dir", default=os.environ.get("FERRY_BENCH_DIR", "/tmp/ferry-bench"))
    p.add_argument("--beside-compute", action="store_true", help="see the module's help")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    size = int(args.size_gb * GIB) // (16 * MIB) * (16 * MIB)
    path = folder / "read-probe.bin"
    block = os.urandom(16 * MIB)
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
        os.fsync(f.fileno())
    variants = [
        ("1 thread, 16 MIB", 1, 16 * MIB, False, False),
        ("4 threads, 16 MIB (Ferry's read path minus CRC)", 4, 16 * MIB, False, False),
        ("4 threads, 16 MIB + CRC32 (Ferry's read path)", 4, 16 * MIB, True, False),
        ("1 thread, 16 MIB + CRC32", 1, 16 * MIB, True, False),
        ("2 threads, 16 MIB", 2, 16 * MIB, False, False),
        ("1 thread, 64 MIB", 1, 64 * MIB, False, False),
        ("1 thread, 16 MIB, O_DIRECT", 1, 16 * MIB, False, True),
        ("4 threads, 16 MIB, O_DIRECT", 4, 16 * MIB, False, True),
        ("4 threads, 16 MIB, O_DIRECT + CRC32", 4, 16 * MIB, True, True),
    ]
    if args.beside_compute:
        try:
            beside_compute(path, size, args.rounds)
        finally:
            path.unlink()
        return 0
    print(f"cold reads of a {fmt_bytes(size)} file in {folder}")
    rows = []
    try:
        for name, threads, chunk, crc, direct in variants:
            best = None
            for _ in range(2):
                drop_page_cache([path])
                c0, t0 = time.process_time(), time.perf_counter()
                try:
                    _read(path, threads, chunk, crc, direct, size)
                except OSError as e:  # O_DIRECT is not supported on every filesystem
                    rows.append((name, f"failed: {e.strerror}", ""))
                    break
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                if best is None or wall < best[0]:
                    best = (wall, cpu)
            if best:
                rows.append((name, f"{size / best[0] / GB:.2f}", f"{best[1] / (size / GIB):.2f}"))
                print(f"  {name}: {rows[-1][1]} GB/s", flush=True)
    finally:
        path.unlink()
    print(md_table(("variant", "GB/s", "CPU s per GiB"), rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
