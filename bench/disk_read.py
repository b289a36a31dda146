"""How the disk tier's read path spends time and CPU on this machine: one cold read of a
file per variant (threads, chunk size, CRC32 check, O_DIRECT), wall GB/s and CPU seconds per
GB. On a CPU-only machine the CPU a read takes is taken from compute, so it is what decides
whether reads can hide behind a forward.

    python -m bench.disk_read [--size-gb 1] [--dir /tmp/ferry-bench]
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

MiB = 1 << 20


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.disk_read", description=__doc__.split("\n")[0]
    )
    p.add_argument("--size-gb", type=float, default=1.0)
    p.add_argument("--dir", default=os.environ.get("FERRY_BENCH_DIR", "/tmp/ferry-bench"))
    args = p.parse_args(argv)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    size = int(args.size_gb * 1e9) // (16 * MiB) * (16 * MiB)
    path = folder / "read-probe.bin"
    block = os.urandom(16 * MiB)
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
        os.fsync(f.fileno())
    variants = [
        ("1 thread, 16 MiB", 1, 16 * MiB, False, False),
        ("4 threads, 16 MiB (Ferry's read path minus CRC)", 4, 16 * MiB, False, False),
        ("4 threads, 16 MiB + CRC32 (Ferry's read path)", 4, 16 * MiB, True, False),
        ("1 thread, 16 MiB + CRC32", 1, 16 * MiB, True, False),
        ("2 threads, 16 MiB", 2, 16 * MiB, False, False),
        ("1 thread, 64 MiB", 1, 64 * MiB, False, False),
        ("1 thread, 16 MiB, O_DIRECT", 1, 16 * MiB, False, True),
        ("4 threads, 16 MiB, O_DIRECT", 4, 16 * MiB, False, True),
        ("4 threads, 16 MiB, O_DIRECT + CRC32", 4, 16 * MiB, True, True),
    ]
    print(f"cold reads of a {size / 1e9:.2f} GB file in {folder}")
    print("| variant | GB/s | CPU s per GB |")
    print("|---|---|---|")
    try:
        for name, threads, chunk, crc, direct in variants:
            best = None
            for _ in range(2):
                drop_page_cache([path])
                c0, t0 = time.process_time(), time.perf_counter()
                try:
                    _read(path, threads, chunk, crc, direct, size)
                except OSError as e:  # O_DIRECT is not supported on every filesystem
                    print(f"| {name} | failed: {e.strerror} | |")
                    break
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                if best is None or wall < best[0]:
                    best = (wall, cpu)
            if best:
                print(f"| {name} | {size / best[0] / 1e9:.2f} | {best[1] / (size / 1e9):.2f} |")
    finally:
        path.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
