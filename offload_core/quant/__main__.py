"""Command line: list presets, or load (quantize, cache) a checkpoint and print the report.

python -m offload_core.quant presets [--device cuda]
python -m offload_core.quant load CKPT --preset int8-weight [--build demo|pkg.mod:fn]
    [--cache-dir DIR] [--skip PATTERN ...] [--device cpu] [--layers]
"""

from __future__ import annotations

import argparse
import sys

from ..errors import FerryError
from ..formats.safetensors import read_checkpoint_header
from ..model.builders import demo_build, import_build
from .presets import PRESETS, resolve_preset


def _presets(args: argparse.Namespace) -> int:
    for name, p in PRESETS.items():
        reason = p.unsupported_reason(args.device)
        where = "runs here" if reason is None else f"not here: {reason}"
        print(f"{name:<15} {p.summary}  [{where}]")
    return 0


def _load(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .loader import load_quantized

    resolve_preset(args.preset, args.device)  # a wrong preset fails before the progress bar
    header = read_checkpoint_header(args.checkpoint)
    build = demo_build(header) if args.build == "demo" else import_build(args.build)
    with tqdm(unit="layer", desc=args.preset) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        _, report = load_quantized(
            args.checkpoint,
            build,
            args.preset,
            cache_dir=args.cache_dir,
            skip=args.skip,
            device=args.device,
            progress=progress,
        )
    print(report.describe() if args.layers else report.summary())
    if report.cache_path:
        print(f"cache: {report.cache_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offload_core.quant", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    pp = sub.add_parser("presets", help="list the presets and whether they run on --device")
    pp.add_argument("--device", default="cpu")
    pl = sub.add_parser("load", help="load a safetensors checkpoint quantized, through the cache")
    pl.add_argument("checkpoint")
    pl.add_argument("--preset", required=True, help=f"one of {', '.join(PRESETS)}")
    pl.add_argument("--build", default="demo", help="'demo' or package.module:function(device)")
    pl.add_argument("--cache-dir", default=None)
    pl.add_argument(
        "--skip", nargs="*", default=None, help="extra fnmatch patterns; '!pattern' forces"
    )
    pl.add_argument("--device", default="cpu")
    pl.add_argument("--layers", action="store_true", help="print one row per layer")
    args = parser.parse_args(argv)
    try:
        return _presets(args) if args.command == "presets" else _load(args)
    except FerryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
