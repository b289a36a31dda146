"""Random GGML K-quant blocks, for the GGUF files the tests and the benchmarks write: the
``gguf`` package decodes K-quants but has no encoder. Kept in bench/ so a benchmark needs no
test module (tests/gguf_standin.py and tests/comfyui/make_gguf_models.py import it from here).
"""

from __future__ import annotations

from typing import Any

import gguf
import numpy as np


def k_quant_bytes(rows: int, width: int, qtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks with small, finite scales: the ``gguf`` package has no K-quant
    encoder (only decoders), so the blocks are made directly. Q4_K and Q5_K blocks start with
    two fp16 scales (d, dmin) and twelve bytes of 6-bit sub-scales and mins (each 1 here, so a
    weight is within a few hundredths of zero); the rest are quants, any bits valid."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, width // block * size), dtype=np.uint8)
    blocks = data.reshape(-1, size)
    blocks[:, 0:2] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    blocks[:, 2:4] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    blocks[:, 4:16] = 1
    return data
