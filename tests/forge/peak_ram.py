"""Peak RAM of the Forge process, without Ferry and with Ferry's disk tier, on the suite's
SD 1.5-shaped float32 checkpoint (4.3 GB): the table in docs/benchmarks.md.

    FERRY_FORGE=/path/to/forge python tests/forge/peak_ram.py [--runs 1]

Each run is a fresh Forge (CPU, the suite's launch flags) that makes three 64x64 generations:
the first loads the checkpoint (and, with Ferry, lays the UNet out), the second runs on what
stayed, the third with Ferry switched off (Forge's own path; the layout is released). A thread reads /proc/<pid>/status every 20 ms; the table gives, per phase, the peak of
RssAnon (the process's own memory: what runs a machine out of RAM) and of RssFile (page cache
mapped by the process, which the kernel can reclaim), and the peak VmRSS over the run
(VmHWM). The images of the two runs are compared byte for byte.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from forge_client import ferry  # noqa: E402
from forge_server import forge_checkout, models_dir, start_forge, stop_forge  # noqa: E402

GIB = float(1 << 30)


def status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "RssFile", "VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024
    return out


@dataclass
class Sampler:
    pid: int
    phase: str = "start"
    peaks: dict[str, dict[str, int]] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                s = status(self.pid)
            except OSError:
                return
            self.last = s
            peak = self.peaks.setdefault(self.phase, {})
            for k in ("RssAnon", "RssFile"):
                peak[k] = max(peak.get(k, 0), s[k])
            time.sleep(0.02)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def one_run(label: str, args: list[object] | None, models: Path, disk: Path) -> dict[str, object]:
    data = Path(tempfile.mkdtemp(prefix="ferry-forge-ram-"))
    srv = start_forge(data, models, with_ferry=args is not None)
    try:
        with Sampler(srv.proc.pid) as s:
            s.phase = "load + 1st generation"
            first = srv.forge.txt2img(args)
            s.phase = "2nd generation"
            second = srv.forge.txt2img(args, seed=2)
            # Ferry switched off (the same request without it): Forge's path again.
            s.phase = "3rd generation, off"
            third = srv.forge.txt2img(None if args is None else ferry(enabled=False), seed=3)
            time.sleep(0.5)
            end = status(srv.proc.pid)
            hwm = end["VmHWM"]
        images = (first.png, second.png, third.png)
        return {
            "label": label,
            "peaks": s.peaks,
            "hwm": hwm,
            "end": end["RssAnon"],
            "images": images,
        }
    finally:
        stop_forge(srv)


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1, help="runs of each (default 1)")
    opts = ap.parse_args()
    forge, py = forge_checkout()
    models = models_dir(forge, py)
    disk = Path(tempfile.mkdtemp(prefix="ferry-forge-ram-disk-"))
    cases = [
        ("Forge without Ferry", None),
        ("Ferry, disk tier, block 1", ferry(tier="disk", disk=str(disk))),
    ]
    rows = [one_run(label, args, models, disk) for _ in range(opts.runs) for label, args in cases]
    print("| run | RssAnon peak: load + 1st generation | RssAnon peak: 2nd generation "
          "| RssFile peak: 2nd generation | RssAnon peak: 3rd generation, Ferry off "
          "| RssAnon after it | VmHWM (peak VmRSS) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        p = r["peaks"]
        load, gen, off = (
            p[k] for k in ("load + 1st generation", "2nd generation", "3rd generation, off")
        )  # type: ignore[index]
        print(f"| {r['label']} | {gib(load['RssAnon'])} | {gib(gen['RssAnon'])} "
              f"| {gib(gen['RssFile'])} | {gib(off['RssAnon'])} | {gib(r['end'])} | {gib(r['hwm'])} |")  # type: ignore[arg-type]  # fmt: skip
    same = all(r["images"] == rows[0]["images"] for r in rows)
    print(f"\nimages byte-identical across runs: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
