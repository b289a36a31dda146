"""Regional compilation: ``torch.compile`` on each repeated block, never around Ferry's hooks.

[Note: compiling with Ferry]
Ferry moves a block's weights in the block's forward pre-hook (wait on the group's copy,
point its tensors at the slot) and back after it. A compiled region around that hook would
have to capture a tensor swap and an event wait: whole-model compilation either breaks the
graph at every group (and its fusions then differ from the unbroken graph's), or, where the
whole model was compiled before Ferry's hooks existed, runs its cached graph without them
(dynamo does not guard on module hooks), which is a silent run without Ferry. So Ferry
compiles ``block.forward`` (an instance attribute), which ``Module.__call__`` calls after its
pre-hooks: the hooks run eagerly, the block's arithmetic runs compiled, and the weights do
not move while it runs.

One compiled graph serves every block of a list: dynamo caches by code object and, inlining
nn modules (torch's default), takes a block's parameters as graph inputs guarded on dtype,
shape, stride and device, never on their addresses. A streamed block computes from views into
the device ring; a group's slot offsets repeat with the forward's pattern and its tensors keep
their objects, so the steps after the first compile nothing, and the graphs compiled are
bounded by the kinds of block (tests/test_compile.py counts them with dynamo's own counters).

CUDA graphs (backend "cudagraphs", or mode "reduce-overhead" / "max-autotune") bake each
graph's weight addresses in: one graph shared by blocks whose weights sit at different slot
offsets would re-record for every block, so ``check_streamed`` refuses them on a streamed
model, as it refuses leaf-level groups (whose hooks sit inside a block).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from ..policy import LeafLevel, Level
from .grouping import find_block_lists

#: The keyword arguments of ``torch.compile`` a setting may carry (ComfyUI's TorchCompileModel
#: keeps these same five in its model options).
COMPILE_KWARGS = ("backend", "options", "mode", "fullgraph", "dynamic")
#: torch.compile modes that record CUDA graphs.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


@dataclass(frozen=True, eq=False)
class CompileSettings:
    """How each block is compiled: ``torch.compile``'s own arguments."""

    backend: str | Callable[..., Any] = "inductor"
    mode: str | None = None
    options: dict[str, Any] | None = field(default=None)
    fullgraph: bool = False
    dynamic: bool | None = None

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> CompileSettings:
        """From ``torch.compile`` keyword arguments (ComfyUI's ``torch_compile_kwargs``)."""
        unknown = sorted(set(kwargs) - set(COMPILE_KWARGS))
        if unknown:
            raise ConfigError(
                "compile",
                f"unknown torch.compile argument(s) {', '.join(unknown)}; Ferry compiles "
                f"blocks with {', '.join(COMPILE_KWARGS)}",
            )
        settings = cls(**{k: v for k, v in kwargs.items() if v is not None})
        settings.validate()
        return settings

    def validate(self) -> None:
        if not (callable(self.backend) or (isinstance(self.backend, str) and self.backend)):
            raise ConfigError("backend", f"must name a torch.compile backend, got {self.backend!r}")
        if self.mode is not None and self.options:
            # torch.compile itself refuses both together, but only at the first call.
            raise ConfigError("mode", "give either a mode or options, not both")

    @property
    def records_cuda_graphs(self) -> bool:
        return self.backend == "cudagraphs" or self.mode in CUDA_GRAPH_MODES

    def check_streamed(self, level: Level) -> None:
        """Refuses what cannot compile a model whose blocks Ferry streams ([Note: compiling
        with Ferry]), before any work."""
        if isinstance(level, LeafLevel):
            raise ConfigError(
                "level",
                "leaf-level groups move weights inside a block, where the compiled graph "
                "runs: choose level block to compile the model",
            )
        if self.records_cuda_graphs:
            raise ConfigError(
                "backend",
                "CUDA graphs fix each graph's weight addresses, and the blocks Ferry streams "
                "share one graph at different addresses: choose backend inductor (mode "
                "default)",
            )

    def kwargs(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "mode": self.mode,
            # torch.compile pops keys it handles itself (guard_filter_fn) out of options.
            "options": dict(self.options) if self.options else None,
            "fullgraph": self.fullgraph,
            "dynamic": self.dynamic,
        }


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of the model's block lists, in order (the units compiled)."""
    return [b for _, lst in find_block_lists(model) for b in lst.children()]


class CompiledBlocks:
    """Each repeated block of ``model`` runs its forward through ``torch.compile`` between
    ``apply()`` and ``remove()`` (or inside ``with``). A block whose ``forward`` someone else
    already replaced is left alone. ``ConfigError`` before anything changes where the model
    has no repeated blocks."""

    def __init__(self, model: nn.Module, settings: CompileSettings) -> None:
        settings.validate()
        self.model = model
        self.blocks = repeated_blocks(model)
        if not self.blocks:
            raise ConfigError(
                "compile",
                f"{type(model).__name__} has no list of repeated blocks to compile; compile "
                "the whole model instead (without Ferry's offload)",
            )
        self.settings = settings
        # By block id, made on the first apply and kept: wrapping a block in torch.compile
        # costs about 3 ms (120 ms a step for 36 blocks on this CPU), and a host applies
        # around every model call.
        self._compiled: dict[int, Callable[..., Any]] = {}

    def apply(self) -> None:
        for b in self.blocks:
            if "forward" in b.__dict__:
                continue
            fn = self._compiled.get(id(b))
            if fn is None:
                fn = torch.compile(b.forward, **self.settings.kwargs())
                self._compiled[id(b)] = fn
            b.forward = fn  # type: ignore[method-assign]

    def remove(self) -> None:
        for b in self.blocks:
            fn = self._compiled.get(id(b))
            if fn is not None and b.__dict__.get("forward") is fn:
                del b.__dict__["forward"]

    def __enter__(self) -> CompiledBlocks:
        self.apply()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
