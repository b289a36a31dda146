"""Every benchmark table, in one module: the drivers measure, this writes what they measured.

Units as offload_core/units.py names them: bytes, held or moved, in GiB-based units
(``fmt_bytes``); rates in decimal GB/s (``GB``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from offload_core.units import GB, fmt_bytes

Row = Sequence[str]


# -- cells ---------------------------------------------------------------------------------------
def md_table(head: Row, rows: Sequence[Row], *, pad: bool = True) -> str:
    """A markdown table, each column padded to its widest cell; with ``pad=False`` every cell
    is as wide as its text, so a row reads ``| name | ...`` (the head-to-head: its readers find
    rows by that, and a lent GPU's output comes back as a 12,000-character tail)."""
    if pad:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    else:
        widths = [0] * len(head)

    def line(cells: Row) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *map(line, rows)])


def rate(gbps: float | None, ceiling: float | None) -> str:
    """A rate in GB/s with its fraction of ``ceiling`` (a measured raw rate)."""
    return f"{gbps:.2f} ({gbps / ceiling:.0%})" if gbps and ceiling else "-"


def equal_cell(r: dict[str, Any]) -> str:
    eq = r.get("equal")
    if eq is None:
        return "-"
    why = r.get("unequal_why") or f"{r.get('max_diff', 0):.1e}"
    return "yes" if eq else f"NO ({why})"


def median_range(values: list[float]) -> tuple[float, float, float]:
    """The median, the lowest and the highest."""
    return statistics.median(values), min(values), max(values)


def machine_line(m: dict[str, Any], *, threads: bool = False, python: bool = False) -> str:
    v = m["versions"]
    cores = f"{m['cores']} cores" + (f" ({m['torch_threads']} torch threads)" if threads else "")
    py = f"Python {m['python']}, " if python else ""
    return (
        f"Machine: {m['cpu']}, {cores}, {fmt_bytes(m['ram'])} RAM, disk {m['disk']}, "
        f"GPU {m['gpu'] or 'none'}; {py}torch {v['torch']}, diffusers {v['diffusers']}, "
        f"accelerate {v['accelerate']}, safetensors {v['safetensors']}."
    )


# -- compare.py: one process per mode ----------------------------------------------------------
def forward_tables(
    results: list[dict[str, Any]], raw_disk: float, pinned_h2d: float | None
) -> tuple[str, str]:
    """Every mode's time, memory and bandwidth; then Ferry's own counters per forward."""
    res = next((r for r in results if r["mode"] == "resident" and "seconds" in r), None)
    base = res["seconds"] if res else None
    head = (
        "mode", "s/forward", "x resident", "peak RssAnon", "RssAnon trimmed", "peak RssFile", "peak VRAM",
        "disk read/fwd", "disk GB/s (% raw)", "to device/fwd", "H2D GB/s (% pinned)", "equal",
    )  # fmt: skip
    rows = []
    for r in results:
        if "skipped" in r or "error" in r:
            why = r.get("skipped") or "FAILED (see log)"
            rows.append((r["mode"], why, *[""] * (len(head) - 2)))
            continue
        s = r["seconds"]
        disk = r["disk_read_per_fwd"]
        dev = r["to_device_per_fwd"]
        rows.append(
            (
                r["mode"],
                f"{s:.3f}",
                f"{s / base:.2f}" if base else "-",
                fmt_bytes(r["peak_rss"]["rss_anon"]),
                fmt_bytes(r["trimmed_rss"]["rss_anon"]),
                fmt_bytes(r["peak_rss"]["rss_file"]),
                fmt_bytes(r["peak_vram"]),
                fmt_bytes(disk) if disk > 1 << 20 else "-",
                rate(disk / s / GB if disk > 1 << 20 else None, raw_disk),
                fmt_bytes(dev) if dev else "-",
                rate(dev / s / GB if dev else None, pinned_h2d),
                equal_cell(r),
            )
        )
    fhead = (
        "Ferry mode", "groups", "prefetch", "stall s/fwd", "transfer s/fwd", "overlap",
        "in-read disk GB/s (% raw)", "on-demand loads",
    )  # fmt: skip
    frows = []
    for r in results:
        f = r.get("ferry")
        if not f:
            continue
        overlap = 1 - f["stall_s"] / f["transfer_s"] if f["transfer_s"] > 0 else None
        in_read = f["bytes_disk"] / f["disk_s"] / GB if f["disk_s"] > 0 else None
        frows.append(
            (
                r["mode"],
                str(f["groups"]),
                str(f["prefetch_depth"]),
                f"{f['stall_s']:.3f}",
                f"{f['transfer_s']:.3f}",
                f"{max(0.0, overlap):.0%}" if overlap is not None else "-",
                rate(in_read, raw_disk),
                f"{f['on_demand_loads']:.0f}",
            )
        )
    return md_table(head, rows), md_table(fhead, frows) if frows else ""


def peer_verdict(results: list[dict[str, Any]], is_disk: Any) -> str:
    """The issue's comparisons, for every Ferry disk mode: time against resident and against
    the faster peer disk offloader; peak RssAnon against the lowest peer's; and the RAM the
    weights hold above the no-model baseline (RssAnon + RssFile: a peer that computes from
    mmapped files holds its weights as RssFile) against the lowest peer's."""
    ok = [r for r in results if "seconds" in r]
    ferry = [r for r in ok if r["mode"].startswith("ferry-") and is_disk(r["mode"])]
    peers = [r for r in ok if not r["mode"].startswith("ferry-") and is_disk(r["mode"])]
    res = next((r for r in ok if r["mode"] == "resident"), None)
    if not ferry or not peers:
        return ""

    def anon(r: dict[str, Any]) -> int:
        return int(r["peak_rss"]["rss_anon"])

    def held(r: dict[str, Any]) -> int:
        base = r["base_rss"]
        peak = r["peak_rss"]
        return int(peak["rss_anon"] - base["rss_anon"] + peak["rss_file"] - base["rss_file"])

    fast = min(peers, key=lambda r: r["seconds"])
    lean = min(peers, key=anon)
    lean_held = min(peers, key=held)
    head = (
        "Ferry disk mode", "x resident", f"x faster than {fast['mode']}",
        f"RssAnon / {lean['mode']}'s", f"weights RAM / {lean_held['mode']}'s",
    )  # fmt: skip
    rows = [
        (
            r["mode"],
            f"{r['seconds'] / res['seconds']:.2f}" if res else "-",
            f"{fast['seconds'] / r['seconds']:.2f}",
            f"{fmt_bytes(anon(r))} / {fmt_bytes(anon(lean))} = {anon(r) / anon(lean):.2f}",
            f"{fmt_bytes(held(r))} / {fmt_bytes(held(lean_held))} = "
            f"{held(r) / max(held(lean_held), 1):.2f}",
        )
        for r in ferry
    ]
    return md_table(head, rows)


# -- paired.py: modes alternating in one process -----------------------------------------------
def paired_table(result: dict[str, Any], rounds: int) -> str:
    head = (
        "mode", "median s/forward", f"x resident, median of {rounds} rounds", "range",
        "x limit, median", "in-read GB/s (x raw read)", "x faster than the faster peer, median",
        "equal", "reading / stalled (x forward)",
    )  # fmt: skip
    rows: list[Row] = [("resident", f"{result['resident_median_s']:.3f}", "1.00", *["-"] * 6)]
    if "raw_median_s" in result:
        rows.append(
            ("raw cold read of the same files", f"{result['raw_median_s']:.3f}", "-", "-", "-",
             f"{result['raw_gbps']:.2f} (1.00)", "-", "-", "-")
        )  # fmt: skip
        rows.append(
            ("limit = max(resident, raw read)", "-", f"{result['limit_x_resident']:.3f}", "-",
             "1.00", "-", "-", "-", "-")
        )  # fmt: skip
    for r in result["rows"]:
        faster, lim, rate_ = r.get("x_faster_than_peers"), r.get("x_limit"), r.get("in_read_gbps")
        busy = f"{r['reading']:.2f} / {r['stalled']:.2f}" if "reading" in r else "-"
        rows.append(
            (
                r["mode"],
                f"{r['median_s']:.3f}",
                f"{r['median_ratio']:.3f}",
                f"{r['min_ratio']:.3f}-{r['max_ratio']:.3f}",
                "-" if lim is None else f"{lim:.3f}",
                "-" if rate_ is None else f"{rate_:.2f} ({r['in_read_x_raw']:.2f})",
                "-" if faster is None else f"{faster:.2f}",
                "yes" if r["equal"] else "NO",
                busy,
            )
        )
    return md_table(head, rows)


# -- load_memory.py: RAM from the file on ------------------------------------------------------
def run_peak_anon(r: dict[str, Any], window: str = "run") -> int:
    """Peak RssAnon over ``load`` (load + first forward), ``later`` or the whole ``run``."""
    if window == "run":
        return max(run_peak_anon(r, "load"), run_peak_anon(r, "later"))
    return int(r[f"peak_{window}"]["rss_anon"])


def load_table(results: list[dict[str, Any]], nbytes: int, peers: Sequence[str]) -> str:
    ok = [r for r in results if "peak_load" in r]
    best = min((run_peak_anon(r) for r in ok if r["mode"] in peers), default=None)
    head = (
        "mode", "peak RssAnon load+1st fwd", "peak RssFile load+1st fwd", "peak RssAnon later",
        "peak RssFile later", "load s", "1st fwd s", "later fwd s",
        "x model size (run peak RssAnon)", "x best peer (run peaks)", "equal",
    )  # fmt: skip
    rows = []
    for r in results:
        if "peak_load" not in r:
            rows.append((r["mode"], r.get("skipped") or "FAILED (see log)", *[""] * 9))
            continue
        rows.append(
            (
                r["mode"],
                fmt_bytes(r["peak_load"]["rss_anon"]),
                fmt_bytes(r["peak_load"]["rss_file"]),
                fmt_bytes(r["peak_later"]["rss_anon"]),
                fmt_bytes(r["peak_later"]["rss_file"]),
                f"{r['load_s']:.1f}",
                f"{r['first_fwd_s']:.1f}",
                f"{r['later_fwd_s']:.1f}",
                f"{run_peak_anon(r) / nbytes:.2f}",
                f"{run_peak_anon(r) / best:.2f}" if best else "-",
                equal_cell(r),
            )
        )
    return md_table(head, rows)


# -- ab_versions.py: two checkouts in one process ----------------------------------------------
def ab_table(
    times: dict[str, list[float]], equal: dict[str, bool], paths: list[str], title: str
) -> str:
    head = (
        "level-read path",
        "A x resident",
        "B x resident",
        "A / B, median (range)",
        "equal A, B",
    )
    rows = []
    for path in paths:
        ta, tb, res = times[f"A-{path}"], times[f"B-{path}"], times["resident"]
        ra = median_range([a / r for a, r in zip(ta, res)])
        rb = median_range([b / r for b, r in zip(tb, res)])
        ab = median_range([a / b for a, b in zip(ta, tb)])
        eq = f"{'yes' if equal[f'A-{path}'] else 'NO'}, {'yes' if equal[f'B-{path}'] else 'NO'}"
        rows.append(
            (path, f"{ra[0]:.3f}", f"{rb[0]:.3f}", f"{ab[0]:.3f} ({ab[1]:.2f}-{ab[2]:.2f})", eq)
        )
    return f"{title}\n\n{md_table(head, rows)}"


# -- h2h.py: the head-to-head, one process per row ---------------------------------------------
H2H_HEAD = (
    "row", "cap", "s/step", "x resident", "peak VRAM", "peak RssAnon", "peak RssFile",
    "H2D GB/s (/ pinned)", "disk GB/s (/ raw)", "equal",
)  # fmt: skip


def h2h_table(results: list[dict[str, Any]], pinned: float | None, raw: float | None) -> str:
    """Every row against its core's resident row (``dyn-*`` rows against ``dyn-resident``);
    ``equal`` as h2h.judge found it."""
    refs = {r["row"]: r for r in results if r["row"] in ("resident", "dyn-resident")}
    rows = []
    for r in results:
        ref = refs.get("dyn-resident" if r["row"].startswith("dyn-") else "resident")
        ref = None if ref is None or "error" in ref else ref
        cap = fmt_bytes(r["cap"]) if r.get("cap") else "none"
        if "error" in r:
            why = r["error"].strip().splitlines()[-1][:150]  # a traceback's last line says what
            rows.append((r["row"], cap, f"FAILED: {why}", *[""] * (len(H2H_HEAD) - 3)))
            continue
        f = r.get("ferry") or {}
        s = r["s_step"]
        # H2D: Ferry's rate while copying (its counters); peers: bytes per step / s per step.
        h2d = f.get("h2d_gbps") or (r["h2d_step"] / s / GB if r.get("h2d_step") else None)
        disk = f.get("disk_gbps") or (r["disk_read_step"] / s / GB if r.get("disk_read_step") else None)  # fmt: skip
        eq = "yes" if r is ref else equal_cell(r)
        if not r.get("latent_finite", True):
            eq += " (latent has NaN/inf)"
        rows.append(
            (
                r["row"],
                cap,
                f"{s:.3f}",
                f"{s / ref['s_step']:.2f}" if ref else "-",
                fmt_bytes(r.get("peak_vram")),
                fmt_bytes(r["rss_anon"]),
                fmt_bytes(r["rss_file"]),
                rate(h2d, pinned),
                rate(disk, raw),
                eq,
            )
        )
    return md_table(H2H_HEAD, rows, pad=False)


def h2h_core_notes(results: list[dict[str, Any]]) -> str:
    """What each dyn row's core turned on, as its worker found it."""
    out = ""
    for r in results:
        core = r.get("core")
        if r["row"].startswith("dyn-") and core:
            pinned = core.get("pinned_limit")
            out += (
                f"\n{r['row']}: dynamic VRAM {'on' if core['dynamic_vram'] else 'off'}, pinned "
                f"memory {'limit ' + fmt_bytes(pinned) if pinned and pinned > 0 else 'off'}, "
                f"{core.get('offload_streams') or 0} offload streams"
            )
    return out
