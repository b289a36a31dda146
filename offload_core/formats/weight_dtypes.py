"""The one table of a loader's ``weight_dtype`` words: the dtype a diffusion model's floating
weights are loaded in (ComfyUI's UNETLoader, Ferry's loader, and the planner counting the
bytes such a loader will hold). Pure data, so the planner side of offload_core can read it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

#: word -> dtype (None: as ComfyUI chooses, from the file). ``_fast`` is core's fp8 matmul
#: switch: the same storage (so the same bytes), a faster kernel.
WEIGHT_DTYPES: Mapping[str, torch.dtype | None] = {
    "default": None,
    "fp8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e4m3fn_fast": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
#: The words Ferry's loader offers: every storage, without core's kernel switch (Ferry's
#: loader has no fp8 matmul path). Saved workflows name them: never remove one.
STORAGE_WEIGHT_DTYPES: tuple[str, ...] = tuple(w for w in WEIGHT_DTYPES if not w.endswith("_fast"))
