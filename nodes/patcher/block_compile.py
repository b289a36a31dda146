"""torch.compile and Ferry in ComfyUI: core's TorchCompileModel, made to compile the blocks.

Core's TorchCompileModel (comfy_api.torch_helpers.set_torch_compile_wrapper, the same in every
core Ferry supports) puts an APPLY_MODEL wrapper under the key "torch.compile" that swaps
``diffusion_model`` for ``torch.compile(diffusion_model)`` while the model runs, and keeps its
``torch.compile`` arguments in ``model_options["torch_compile_kwargs"]``. On a model Ferry
streams, that whole-model graph cannot hold Ferry's weight swaps ([Note: compiling with
Ferry] in offload_core/model/regional_compile.py). So on a Ferry patcher core's wrapper is
replaced by ``BlockCompile``, which compiles the repeated blocks with the same arguments, in
either node order:

- TorchCompileModel after Ferry Offload Model adds its wrapper to a clone of Ferry's patcher,
  whose ``add_wrapper_with_key`` hands it to ``in_place_of``;
- TorchCompileModel before it: the clone Ferry's node makes carries core's wrapper, and
  ``adopt`` replaces it there.

The arguments are read from the patcher's model options when the model runs (core sets them
just after adding its wrapper). "Ferry Compile Blocks" (``FerryCompileBlocks``) puts the same
wrapper on any model, with or without Ferry: the same graphs, so its output is what Ferry's
compiled output is compared with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from comfy.patcher_extension import WrappersMP

from ...offload_core import ConfigError, find_offload
from ...offload_core.model.regional_compile import CompiledBlocks, CompileSettings
from ..input_error import as_node_error
from ..planning.config import ComfyOffload

log = logging.getLogger("ferry")

#: comfy_api.torch_helpers' names (strings there too; not imported: older cores lack them).
COMPILE_KEY = "torch.compile"
COMPILE_KWARGS = "torch_compile_kwargs"


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (its own counter; 0 where it has none)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # a torch without dynamo's counters: nothing to report
        return 0
    return int(counters["stats"]["unique_graphs"])


class BlockCompile:
    """The APPLY_MODEL wrapper that runs the diffusion model with its repeated blocks
    compiled. ``options``: a patcher's model options, read when the model runs."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = options
        self._blocks: CompiledBlocks | None = None  # kept while the model and settings are

    def _compiled_blocks(self, dm: Any, settings: CompileSettings) -> CompiledBlocks:
        b = self._blocks
        if b is None or b.model is not dm or b.settings != settings:
            b = self._blocks = CompiledBlocks(dm, settings)
        return b

    def settings(self) -> CompileSettings:
        kwargs = self.options.get(COMPILE_KWARGS) or {"backend": "inductor"}
        return CompileSettings.from_kwargs(kwargs)

    def __call__(self, executor: Any, *args: Any, **kwargs: Any) -> Any:
        dm = executor.class_obj.diffusion_model
        try:
            settings = self.settings()
            handle = find_offload(dm)
            if handle is not None:
                settings.check_streamed(handle.policy.level)
            blocks = self._compiled_blocks(dm, settings)
        except ConfigError as e:
            raise as_node_error(e) from None
        before = compiled_graphs()
        with blocks:
            out = executor(*args, **kwargs)
        new = compiled_graphs() - before
        if new:
            log.info(
                "ferry: torch.compile compiled %d graph(s) for %d blocks of %s (%s)",
                new,
                len(blocks.blocks),
                type(dm).__name__,
                "streamed by Ferry" if find_offload(dm) is not None else "resident",
            )
        return out


def in_place_of(
    patcher: Any, wrapper_type: str, key: str, wrapper: Callable[..., Any]
) -> Callable[..., Any]:
    """What a Ferry patcher keeps when ``wrapper`` is added: core's compile wrapper becomes
    ``BlockCompile``; anything else stays."""
    core = wrapper_type == WrappersMP.APPLY_MODEL and key == COMPILE_KEY
    if core and not isinstance(wrapper, BlockCompile):
        return BlockCompile(patcher.model_options)
    return wrapper


def adopt(patcher: Any) -> None:
    """Replaces a core compile wrapper the patcher already carries (see the module's doc)."""
    found = patcher.get_wrappers(WrappersMP.APPLY_MODEL, COMPILE_KEY)
    if found and not all(isinstance(w, BlockCompile) for w in found):
        patcher.remove_wrappers_with_key(WrappersMP.APPLY_MODEL, COMPILE_KEY)
        patcher.add_wrapper_with_key(
            WrappersMP.APPLY_MODEL, COMPILE_KEY, BlockCompile(patcher.model_options)
        )


def check(patcher: Any, config: ComfyOffload) -> None:
    """Before any weight moves: a compile Ferry cannot stream under is refused by name."""
    found = patcher.get_wrappers(WrappersMP.APPLY_MODEL, COMPILE_KEY)
    for w in found:
        if isinstance(w, BlockCompile):
            try:
                w.settings().check_streamed(config.policy.level)
            except ConfigError as e:
                raise as_node_error(e) from None


__all__ = ["BlockCompile", "adopt", "check", "in_place_of"]
