"""Runs forwards of an offloaded model in a fresh process (a clean C heap) and prints, as JSON,
RssAnon before and after them and how many heap trims they made (tests/test_heap_trim.py).

    python heap_trim_worker.py quantized|plain trim|no-trim

``quantized``: a stand-in for a quantized model on a CPU: each Linear stores an int8 weight
and a scale and dequantizes it into a new float32 tensor on every call, as core's fp8_scaled
ops and GGUF's do. ``plain``: the same shapes with float32 weights, used as they are.
``no-trim``: the engine is told no group computes from copies (the control: what RssAnon
would hold if the engine no longer trimmed after quantized groups).
"""

from __future__ import annotations

import gc
import json
import sys

import torch
import torch.nn.functional as F
from torch import nn

from offload_core import BlockLevel, OffloadPolicy, RamTier, apply_offload
from offload_core.runtime import engine, memory

DIM, FFN, BLOCKS, FORWARDS = 1024, 2048, 6, 2
#: One block's dequantized copies: six DIM x DIM and two DIM x FFN float32 weights, each made
#: twice per call (the cast, then the scaled product).
BLOCK_COPY_BYTES = 2 * (6 * DIM * DIM + 2 * DIM * FFN) * 4


class QuantLinear(nn.Module):
    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        w = torch.randint(-127, 128, (n_out, n_in), dtype=torch.int8)
        self.weight = nn.Parameter(w, requires_grad=False)
        self.scale = nn.Parameter(torch.tensor(5e-4), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype) * self.scale)


class Block(nn.Module):
    def __init__(self, linear: type[nn.Module]) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o, self.c1, self.c2 = (linear(DIM, DIM) for _ in range(6))
        self.up, self.down = linear(DIM, FFN), linear(FFN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.o(self.q(x) * torch.sigmoid(self.k(x)) + self.v(x))
        x = x + self.c2(self.c1(x))
        return x + self.down(F.gelu(self.up(x)))


class Net(nn.Module):
    def __init__(self, linear: type[nn.Module]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block(linear) for _ in range(BLOCKS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def plain_linear(n_in: int, n_out: int) -> nn.Module:
    return nn.Linear(n_in, n_out, bias=False)


def main(kind: str, trim: str) -> None:
    net = Net(QuantLinear if kind == "quantized" else plain_linear).requires_grad_(False)
    x = torch.randn(8, DIM, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = net(x)
    if trim == "no-trim":
        engine.computes_from_copies = lambda entries: False  # type: ignore[assignment]
    handle = apply_offload(
        net, OffloadPolicy(level=BlockLevel(1), tier=RamTier()), onload_device="cpu"
    )
    trims = [0]
    real_trim = memory.trim_heap

    def counted() -> None:
        trims[0] += 1
        real_trim()

    gc.collect()
    real_trim()  # what the layout let go: not the forwards'
    memory.trim_heap = counted  # the seam every trim on the forward path goes through
    before = memory.process_memory().rss_anon
    with torch.no_grad():
        for _ in range(FORWARDS):
            out = net(x)
    after = memory.process_memory().rss_anon
    memory.trim_heap = real_trim
    equal = torch.equal(out, ref)
    handle.remove()
    print(
        json.dumps(
            {
                "before": before,
                "after": after,
                "trims": trims[0],
                "groups": BLOCKS,
                "forwards": FORWARDS,
                "block_copy_bytes": BLOCK_COPY_BYTES,
                "equal": equal,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
