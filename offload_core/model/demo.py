"""A synthetic DiT-like model (Flux-shaped: double-stream then single-stream blocks) with a
fixed seed, for the demo, the tests and the benchmarks. No download, any size.

``build_demo_model(size_gb)`` sizes the model in GB of weights, a GiB as units.py says every
memory GB is (about: the shape rule rounds to whole blocks), the same unit a user types in the
panel and on the command lines.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..units import GIB


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return q, k, v


class DoubleBlock(nn.Module):
    """Image and text streams with their own weights, joint attention (as in Flux/MMDiT)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.img_mod = nn.Linear(dim, 6 * dim)
        self.txt_mod = nn.Linear(dim, 6 * dim)
        self.img_attn = _Attention(dim, heads)
        self.txt_attn = _Attention(dim, heads)
        self.img_mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim)
        )
        self.txt_mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim)
        )
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(
        self, img: torch.Tensor, txt: torch.Tensor, vec: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        i_sh1, i_sc1, i_g1, i_sh2, i_sc2, i_g2 = self.img_mod(F.silu(vec))[:, None].chunk(6, dim=-1)
        t_sh1, t_sc1, t_g1, t_sh2, t_sc2, t_g2 = self.txt_mod(F.silu(vec))[:, None].chunk(6, dim=-1)
        iq, ik, iv = self.img_attn.qkv_heads(self.norm(img) * (1 + i_sc1) + i_sh1)
        tq, tk, tv = self.txt_attn.qkv_heads(self.norm(txt) * (1 + t_sc1) + t_sh1)
        q, k, v = (torch.cat([a, b], dim=2) for a, b in ((tq, iq), (tk, ik), (tv, iv)))
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        t_out, i_out = out[:, : txt.shape[1]], out[:, txt.shape[1] :]
        img = img + i_g1 * self.img_attn.proj(i_out)
        img = img + i_g2 * self.img_mlp(self.norm(img) * (1 + i_sc2) + i_sh2)
        txt = txt + t_g1 * self.txt_attn.proj(t_out)
        txt = txt + t_g2 * self.txt_mlp(self.norm(txt) * (1 + t_sc2) + t_sh2)
        return img, txt


class SingleBlock(nn.Module):
    """One stream over the joined tokens, attention and MLP in parallel (as in Flux)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.mod = nn.Linear(dim, 3 * dim)
        self.linear1 = nn.Linear(dim, 3 * dim + 4 * dim)
        self.linear2 = nn.Linear(dim + 4 * dim, dim)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.dim = dim

    def forward(self, x: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.mod(F.silu(vec))[:, None].chunk(3, dim=-1)
        h = self.linear1(self.norm(x) * (1 + scale) + shift)
        qkv, mlp = h.split([3 * self.dim, 4 * self.dim], dim=-1)
        b, n, _ = x.shape
        q, k, v = qkv.view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        return x + gate * self.linear2(torch.cat([attn, F.gelu(mlp, approximate="tanh")], dim=-1))


class DemoDiT(nn.Module):
    def __init__(
        self, dim: int, heads: int, n_double: int, n_single: int, in_channels: int = 64
    ) -> None:
        super().__init__()
        self.dim, self.in_channels = dim, in_channels
        self.img_in = nn.Linear(in_channels, dim)
        self.txt_in = nn.Linear(dim, dim)
        self.time_in = nn.Sequential(nn.Linear(256, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.double_blocks = nn.ModuleList(DoubleBlock(dim, heads) for _ in range(n_double))
        self.single_blocks = nn.ModuleList(SingleBlock(dim, heads) for _ in range(n_single))
        self.final_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.final_mod = nn.Linear(dim, 2 * dim)
        self.proj_out = nn.Linear(dim, in_channels)

    def forward(
        self, img: torch.Tensor, txt: torch.Tensor, timesteps: torch.Tensor
    ) -> torch.Tensor:
        vec = self.time_in(_timestep_embedding(timesteps, 256).to(img.dtype))
        img, txt = self.img_in(img), self.txt_in(txt)
        for block in self.double_blocks:
            img, txt = block(img, txt, vec)
        x = torch.cat([txt, img], dim=1)
        for sblock in self.single_blocks:
            x = sblock(x, vec)
        img = x[:, txt.shape[1] :]
        shift, scale = self.final_mod(F.silu(vec))[:, None].chunk(2, dim=-1)
        return self.proj_out(self.final_norm(img) * (1 + scale) + shift)


def _timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(
        -math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half
    )
    args = t.float()[:, None] * freqs[None] * 1000
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def _shape_for(size_gb: float, dtype: torch.dtype) -> tuple[int, int, int]:
    """(dim, n_double, n_single) giving about ``size_gb`` of weights."""
    params = size_gb * GIB / torch.empty((), dtype=dtype).element_size()
    dim = 64
    for d in (64, 128, 256, 512, 1024, 1536, 2048, 3072):
        # Prefer a width whose model has at least ~6 double blocks.
        if 6 * 66 * d * d <= params:
            dim = d
    per_pair = 66 * dim * dim  # one double block (36 d^2) + two single blocks (2 x 15 d^2)
    n_double = max(2, round(params / per_pair))
    return dim, n_double, 2 * n_double


def demo_on_meta(size_gb: float = 2.0, dtype: torch.dtype = torch.bfloat16) -> DemoDiT:
    """The demo model of ``size_gb`` with every tensor on the meta device (no memory): its
    shapes, for planning it without building it."""
    dim, n_double, n_single = _shape_for(size_gb, dtype)
    with torch.device("meta"):
        return DemoDiT(dim, max(dim // 64, 1), n_double, n_single).to(dtype)


def build_demo_model(
    size_gb: float = 2.0, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> DemoDiT:
    """A DiT of about ``size_gb`` GiB of weights, random but reproducible, on the CPU."""
    if not size_gb > 0:
        raise ValueError(f"size_gb must be > 0, got {size_gb}")
    dim, n_double, n_single = _shape_for(size_gb, dtype)
    with torch.device("meta"):
        model = DemoDiT(dim, max(dim // 64, 1), n_double, n_single)
    model = model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.02, generator=gen)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)
    model = model.to(dtype).eval().requires_grad_(False)
    return model


def demo_inputs(
    model: DemoDiT,
    batch: int = 1,
    tokens: int = 256,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Keyword arguments for ``model(**inputs)``: image tokens, 32 text tokens, timesteps."""
    gen = torch.Generator().manual_seed(seed)
    dtype = model.img_in.weight.dtype
    img = torch.randn(batch, tokens, model.in_channels, generator=gen).to(dtype)
    txt = torch.randn(batch, 32, model.dim, generator=gen).to(dtype)
    t = torch.rand(batch, generator=gen)
    return {"img": img.to(device), "txt": txt.to(device), "timesteps": t.to(device)}
