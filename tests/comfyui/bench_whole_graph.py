"""The whole graph in real ComfyUI (issue 29): a text encoder bigger than the diffusion model,
the diffusion model, a VAE; plain against Ferry on the text encoder, the model, and both.

    python tests/comfyui/bench_whole_graph.py --comfy /work/comfy/v0.33.0 [--workdir DIR] [--limit-mib 1800]
        [--tier disk] [--out FILE]

The files (tests/comfyui/whole_graph.py make_graph_base): a T5-XXL-shaped encoder of 2.5 GB
float16 (CLIPLoader type sd3), an SD3-shaped MMDiT of 0.6 GB float32 whose
text input is that T5's width, and SD3's 16-channel VAE (84 M values); the graph is
tests/comfyui/whole_graph.py's. Each row is a fresh ComfyUI server (``--cpu``), so its time
includes every load, as a user's first run of a workflow does. The files are read once before
the rows, so every row starts with them in the page cache.

Columns: ``first latent`` is the time from queueing the prompt to SaveLatent's file on disk;
``done`` to the prompt's end (the VAE decode and the image saved); ``peak RSS`` is the
process's VmHWM (its own memory and the file pages it mapped); ``peak anon`` its RssAnon
sampled every 50 ms (its own memory alone: what a memory limit cannot reclaim);
``equal`` compares the latent and the decoded image with the plain row's, ``torch.equal``.
With ``--limit-mib``, plain and ferry-both run again inside a memory cgroup of that size
(root; tests/cgroup_limit.py): ``killed`` where the kernel killed the server.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# A driver of the real-ComfyUI harness beside it (conftest's server, the workflows client,
# whole_graph.py's files and graph, the cgroups): it lives here, not in bench/, so bench/
# imports no test module. Run as a script, its folder is already on sys.path.
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from offload_core.units import MIB, fmt_bytes  # noqa: E402


def warm_cache(base: Path) -> None:
    for p in sorted((base / "models").rglob("*.safetensors")):
        with open(p, "rb") as f:
            while f.read(64 * MIB):
                pass


def run_row(base: Path, variant: Any, prefix: str, limit: int | None) -> dict[str, Any]:
    """One fresh server (inside a cgroup of ``limit`` bytes if given) runs the whole graph."""
    from conftest import comfy_checkout, start_server, stop_server
    from ferry_workflows import Client, error_message
    from test_comfyui_bigger_than_ram import RssAnonPeak
    from whole_graph import outputs, whole_graph

    from tests import cgroup_limit

    comfy, py = comfy_checkout()
    group = cgroup_limit.MemoryGroup(limit, name="ferry-bench-graph") if limit else None
    srv = start_server(comfy, py, base, preexec_fn=group.enter if group else None)
    out: dict[str, Any] = {"row": variant.name, "limit": limit}
    peaks = RssAnonPeak(srv.proc.pid)
    try:
        client = Client(srv.url)
        t0 = time.monotonic()
        status, body = client.queue(whole_graph(variant, prefix))
        assert status == 200, body
        first = None
        while True:
            if first is None and list((base / "output").glob(f"{prefix}_*.latent")):
                first = time.monotonic() - t0
            try:
                hist, lost = client.get(f"/history/{body['prompt_id']}"), False
            except OSError:
                hist, lost = {}, True
            if srv.proc.poll() is not None or (lost and _exits(srv.proc)):
                out["killed"] = srv.proc.returncode == -9
                out["error"] = f"server exited {srv.proc.returncode}"
                return out
            entry = hist.get(body["prompt_id"])
            if entry and entry.get("status", {}).get("status_str") in ("success", "error"):
                break
            time.sleep(0.1)
        out["done_s"] = time.monotonic() - t0
        out["first_latent_s"] = first
        if entry["status"]["status_str"] != "success":
            out["error"] = error_message(entry)
            return out
        out.update(outputs(base, entry, prefix))  # the finally adds the peaks to out
        return out
    finally:
        out["peak_anon"], out["peak_rss"] = peaks.stop(), peaks.hwm
        stop_server(srv)
        if group is not None:
            group.remove()


def _exits(proc: subprocess.Popen[bytes]) -> bool:
    """Whether a server that stopped answering has exited (within a few seconds)."""
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return True


def table(rows: list[dict[str, Any]], reference: dict[str, Any]) -> str:
    import torch

    lines = [
        "| row | memory limit | first latent (s) | done (s) | peak RSS (MiB) | peak anon (MiB) | equal to plain |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        limit = f"{fmt_bytes(r['limit'])} cgroup" if r["limit"] else "none"
        if "error" in r:
            what = "killed (-9)" if r.get("killed") else r["error"]
            lines.append(
                f"| {r['row']} | {limit} | - | - | {r['peak_rss'] / MIB:.0f} | "
                f"{r['peak_anon'] / MIB:.0f} | {what} |"
            )
            continue
        equal = torch.equal(r["latent"], reference["latent"]) and torch.equal(
            r["image"], reference["image"]
        )
        first = r["first_latent_s"]
        lines.append(
            f"| {r['row']} | {limit} | {first:.1f} | {r['done_s']:.1f} | "
            f"{r['peak_rss'] / MIB:.0f} | {r['peak_anon'] / MIB:.0f} | "
            f"{'yes' if equal else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--comfy", default=os.environ.get("FERRY_COMFYUI"))
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ferry-bench-graph"))
    ap.add_argument("--limit-mib", type=int, default=0)
    ap.add_argument("--tier", default="disk", choices=("pinned", "ram", "disk"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if not args.comfy or not (Path(args.comfy) / "main.py").is_file():
        ap.error("--comfy (or FERRY_COMFYUI) must name a ComfyUI checkout")
    os.environ["FERRY_COMFYUI"] = str(Path(args.comfy).resolve())
    from dataclasses import replace

    from conftest import comfy_checkout
    from make_text_encoders import BIG_T5XXL_FILE
    from whole_graph import FERRY_BOTH, PLAIN, VARIANTS, make_graph_base

    comfy, _ = comfy_checkout()
    base = args.workdir / comfy.name
    if not (base / "models" / "vae").is_dir():
        base.mkdir(parents=True, exist_ok=True)
        print(f"writing the models under {base} (a few minutes)", flush=True)
        make_graph_base(base)
    shutil.rmtree(base / "output", ignore_errors=True)  # a row's first latent is its own file
    warm_cache(base)
    te_mb = (base / "models" / "text_encoders" / BIG_T5XXL_FILE).stat().st_size // MIB
    rows = []
    plan = [(replace(v, tier=args.tier), None) for v in VARIANTS]
    if args.limit_mib:
        if args.limit_mib * MIB >= te_mb * MIB:
            ap.error(f"--limit-mib {args.limit_mib} is not below the text encoder's {te_mb} MiB")
        plan += [
            (replace(FERRY_BOTH, tier=args.tier), args.limit_mib * MIB),
            (PLAIN, args.limit_mib * MIB),
        ]
    for i, (variant, limit) in enumerate(plan):
        print(f"[{i + 1}/{len(plan)}] {variant.name} limit={limit and limit // MIB}", flush=True)
        rows.append(run_row(base, variant, f"bench-{i}-{variant.name}", limit))
    reference = rows[0]
    if "error" in reference:
        print(f"the plain row failed: {reference['error']}", file=sys.stderr)
        return 1
    text = (
        f"ComfyUI {comfy.name}, `--cpu`; text encoder {te_mb} MiB (T5-XXL-shaped, fp16), "
        f"tier {args.tier}\n\n" + table(rows, reference)
    )
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
