"""Units, named once for the whole engine.

- A "GB" of memory (a VRAM or RAM budget, a slab, a size shown to a user) is a GiB,
  ``GIB`` = 2**30 bytes: what the budget widgets and the settings file have always meant.
- A rate is in GB/s of decimal gigabytes, ``GB`` = 10**9 bytes per second, as disks and
  buses are rated (``gbps``).
- ``PAGE`` is the I/O page: slabs end on it and direct reads are issued in it.
"""

from __future__ import annotations

#: Bytes in a GiB: every memory amount (budgets, sizes) a user reads or types as "GB".
GIB = 1 << 30
MIB = 1 << 20
#: Bytes in a decimal GB: rates only (``gbps``).
GB = 10**9
#: The I/O page: a slab ends on it, a group file's data starts on it, O_DIRECT reads in it.
PAGE = 4096


def gbps(nbytes: int, seconds: float) -> float | None:
    """A transfer rate in GB/s (decimal); None when nothing was moved or timed."""
    return nbytes / seconds / GB if seconds > 0 and nbytes > 0 else None


def fmt_bytes(n: float | None) -> str:
    """A byte count for people: B, KiB, MiB, GiB or TiB."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
