"""The planner's size of a file (planner/stored_sizes.py's table, with the dtype rule and the
quantized formats nodes/graph_plan.py gives it) against what core's own loader holds, for a
Wan in bf16, fp8_scaled, comfy_quant mixed and (a core with it) MXFP8, in real ComfyUI on the
CPU, with the planner's old rule (every float in the compute dtype) beside. Prints a table.

    FERRY_REPO=$PWD PYTHONPATH=$PWD/tests/comfyui/site \\
        <checkout>/venv/bin/python tests/comfyui/planned_sizes.py $PWD <checkout> [out dir]
"""

from __future__ import annotations

import os
import sys
from typing import Any


def old_plan(path: str, rule: Any) -> int:
    """The planner before the table: every floating tensor in the rule's dtype for the
    file's main floating dtype."""
    from offload_core.formats.safetensors import read_checkpoint_header

    entries = list(read_checkpoint_header(path).entries.values())
    by: dict[Any, int] = {}
    for t in entries:
        if t.dtype.is_floating_point:
            by[t.dtype] = by.get(t.dtype, 0) + t.nbytes
    params = sum(t.nbytes // t.dtype.itemsize for t in entries if t.dtype.is_floating_point)
    cast = rule(max(by, key=lambda d: by[d]), params)
    return sum(
        t.nbytes // t.dtype.itemsize * cast.itemsize if t.dtype.is_floating_point else t.nbytes
        for t in entries
    )


def main(repo: str, comfy_dir: str, out: str) -> None:
    sys.path.insert(0, comfy_dir)
    import comfy.cli_args

    comfy.cli_args.args.cpu = True
    import comfy.model_management as mm
    import comfy.sd
    import comfy.utils

    sys.path[:0] = [os.path.join(repo, "tests", "comfyui"), repo]
    import make_quant_models as mq
    from safetensors.torch import save_file

    from offload_core.model.layout import module_nbytes
    from offload_core.planner.network_file import network_from_file

    os.makedirs(out, exist_ok=True)
    sd = {k: v.contiguous() for k, v in mq.wan_state_dict(comfy_dir, 512, 4).items()}
    files = {"bf16": (sd, {}), "fp8_scaled": (mq.fp8_scaled(sd, ""), {}),
             "comfy_quant-mixed": (mq.mixed(sd, "blocks."), {})}  # fmt: skip
    mx = mq.mxfp8(sd, "blocks.")
    if mx is not None:
        files["comfy_quant-mxfp8"] = mx
    device = mm.get_torch_device()

    def rule(stored: Any, params: int) -> Any:  # nodes/graph_plan.py _cast("model")
        return mm.unet_dtype(device, model_params=params, weight_dtype=stored)

    # nodes/graph_plan.py _keeps: comfy_quant from v0.8 on
    keeps = ("fp8_scaled",) + (
        ("comfy_quant",) if hasattr(comfy.utils, "convert_old_quants") else ()
    )
    print(f"core {os.path.basename(comfy_dir.rstrip('/'))}, device {device}")
    print(f"{'file':20} {'on disk':>10} {'core holds':>11} {'old plan':>10} {'new plan':>10}")
    for name, (tensors, meta) in files.items():
        path = os.path.join(out, name + ".safetensors")
        save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)
        held = module_nbytes(comfy.sd.load_diffusion_model(path).model.diffusion_model)
        new = network_from_file(path, name=name, kind="model", cast=rule, keeps=keeps).nbytes
        size = os.path.getsize(path)
        print(f"{name:20} {size:>10} {held:>11} {old_plan(path, rule):>10} {new:>10}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "/tmp/ferry-planned-sizes")
