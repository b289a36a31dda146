"""The benchmark's two models, each built once, saved as a safetensors checkpoint, and loaded
by every mode's subprocess into ordinary (anonymous) memory, so every mode starts from the
same bytes:

- ``flux``: diffusers' FluxTransformer2DModel built from a config (depth and width reduced to
  fit the machine) with seeded random weights: the architecture the peers were written for.
- ``dit``: Ferry's synthetic DiT (offload_core.model.demo) at a size flag.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # "flux" | "dit"
    dtype: str = "fp32"
    # flux
    layers: int = 4  # double-stream blocks
    single_layers: int = 8
    heads: int = 12  # x 128 = hidden width
    # dit
    size_gb: float = 1.0
    seed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def label(self) -> str:
        if self.kind == "flux":
            return (
                f"FluxTransformer2DModel ({self.layers} double + {self.single_layers} single "
                f"blocks, width {self.heads * 128}, {self.dtype})"
            )
        from offload_core.units import GIB, fmt_bytes

        return f"Ferry demo DiT (about {fmt_bytes(self.size_gb * GIB)}, {self.dtype})"


@dataclass(frozen=True)
class InputSpec:
    tokens: int  # image tokens
    txt_tokens: int
    batch: int = 1
    seed: int = 0


def _flux_class() -> type[nn.Module]:
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel


def empty_model(spec: ModelSpec) -> nn.Module:
    """The model's structure on the meta device (no memory)."""
    with torch.device("meta"):
        if spec.kind == "flux":
            model = _flux_class()(
                patch_size=1,
                in_channels=64,
                num_layers=spec.layers,
                num_single_layers=spec.single_layers,
                attention_head_dim=128,
                num_attention_heads=spec.heads,
                joint_attention_dim=4096,
                pooled_projection_dim=768,
                guidance_embeds=False,
                axes_dims_rope=(16, 56, 56),
            )
        elif spec.kind == "dit":
            from offload_core.model.demo import DemoDiT, _shape_for

            dim, n_double, n_single = _shape_for(spec.size_gb, DTYPES[spec.dtype])
            model = DemoDiT(dim, max(dim // 64, 1), n_double, n_single)
        else:
            raise ValueError(f"unknown model kind {spec.kind!r}; use flux or dit")
    return model


def _init_(spec: ModelSpec, name: str, p: torch.Tensor, gen: torch.Generator) -> None:
    """The seeded initial value of one float32 parameter, in place (one rule per kind; the
    demo DiT's is offload_core.model.demo's)."""
    if spec.kind == "dit":
        if name.endswith("bias"):
            p.normal_(0.0, 0.02, generator=gen)
        else:
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)
    elif p.dim() == 1:
        if "norm" in name and name.endswith("weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, 0.02, generator=gen)
    else:
        p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)


def build_model(spec: ModelSpec) -> nn.Module:
    """Seeded random weights (normal, std 1/sqrt(fan_in); biases 0.02), on the CPU."""
    if spec.kind == "dit":
        from offload_core.model.demo import build_demo_model

        return build_demo_model(spec.size_gb, DTYPES[spec.dtype], seed=spec.seed)
    model = empty_model(spec).to_empty(device="cpu")
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            _init_(spec, name, p, gen)
    return model.to(DTYPES[spec.dtype]).eval().requires_grad_(False)


def save_checkpoint(model: nn.Module, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))


def write_checkpoint(spec: ModelSpec, path: Path) -> int:
    """A checkpoint of the same weights as ``build_model(spec)``, written one tensor at a time
    (the model stays on meta), so a model bigger than RAM can be written. Returns its size."""
    from offload_core.formats.safetensors import write_file

    model = empty_model(spec)
    params = dict(model.named_parameters())
    if set(model.state_dict()) != set(params):
        raise ValueError(f"{spec.label} has buffers in its state dict; use save_checkpoint")
    dtype = DTYPES[spec.dtype]
    gen = torch.Generator().manual_seed(spec.seed)

    def tensors():  # type: ignore[no-untyped-def]
        for name, p in params.items():  # build_model's order: the same draws
            t = torch.empty(p.shape, dtype=torch.float32)
            _init_(spec, name, t, gen)
            yield name, t.to(dtype)

    specs = [(k, dtype, tuple(p.shape)) for k, p in params.items()]
    with open(path, "wb") as f:
        return write_file(f, specs, {"format": "pt"}, tensors())


def load_model(spec: ModelSpec, checkpoint: Path) -> nn.Module:
    """The model with the checkpoint's weights copied into fresh anonymous memory (as a
    normal load leaves it), not left mapped to the file."""
    from safetensors import safe_open

    model = empty_model(spec)
    sd = {}
    with safe_open(str(checkpoint), framework="pt", device="cpu") as f:
        for k in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            sd[k] = f.get_tensor(k).clone()
    model.load_state_dict(sd, assign=True, strict=True)
    del sd
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.device.type == "meta":
            raise RuntimeError(f"{name} was not in the checkpoint")
    return model.eval().requires_grad_(False)


def make_inputs(spec: ModelSpec, inp: InputSpec, model: nn.Module) -> dict[str, Any]:
    """Keyword arguments for one forward, seeded, on the CPU."""
    gen = torch.Generator().manual_seed(inp.seed)
    dtype = DTYPES[spec.dtype]
    b = inp.batch
    if spec.kind == "dit":
        from offload_core.model.demo import demo_inputs

        x = demo_inputs(model, batch=b, tokens=inp.tokens, seed=inp.seed)  # type: ignore[arg-type]
        x["txt"] = x["txt"][:, : inp.txt_tokens] if inp.txt_tokens else x["txt"]
        return x
    side = math.isqrt(inp.tokens)
    h = side
    w = inp.tokens // side
    n = h * w
    img_ids = torch.zeros(n, 3)
    img_ids[:, 1] = torch.arange(h).repeat_interleave(w).float()
    img_ids[:, 2] = torch.arange(w).repeat(h).float()
    return {
        "hidden_states": torch.randn(b, n, 64, generator=gen).to(dtype),
        "encoder_hidden_states": torch.randn(b, inp.txt_tokens, 4096, generator=gen).to(dtype),
        "pooled_projections": torch.randn(b, 768, generator=gen).to(dtype),
        "timestep": torch.rand(b, generator=gen).to(dtype),
        "img_ids": img_ids.to(dtype),
        "txt_ids": torch.zeros(inp.txt_tokens, 3).to(dtype),
        "return_dict": False,
    }


def forward(model: nn.Module, x: dict[str, Any]) -> torch.Tensor:
    out = model(**x)
    return out[0] if isinstance(out, tuple) else out


def to_device(x: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in x.items()}


def param_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
