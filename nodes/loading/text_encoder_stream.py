"""The Ferry text-encoder loader's CLIP: core's own CLIP, its encoders' tensors on the meta
device, their weights left in the file(s) until Ferry Offload Text Encoder lays them out
(stream_loader.py does the same for a diffusion model).

Core decides everything as CLIPLoader does: ``comfy.sd.load_text_encoder_state_dicts`` is
given each file's tensors as meta tensors (from the safetensors header: nothing of the file is
read but its small non-float tensors, such as a tokenizer blob core reads at build), detects
the encoder kind from them, builds the CLIP (``initial_device`` meta: no weight is allocated)
and hands each tensor to the encoder it belongs to, through its own key renames. Which file
tensor each parameter got is seen, not guessed (offload_core/sources/load_trace.py). Files in
core's own quantized formats (``fp8_scaled``, ``comfy_quant``) go through core's
``convert_old_quants`` first, as ``load_clip`` does, and core's ops build each quantized layer's
``QuantizedTensor`` on meta: its inner tensors (fp8 data, scales) are traced to their keys too
(core_quant_stream.py). A tensor core replaced on the way (a transpose, a cast it does itself)
is not the file's, so that file cannot stay in it: ``lazy_clip`` returns None and the caller
loads the CLIP whole, saying so.

With Ferry Offload Text Encoder after the loader, every file is the layout's source for its
own encoder's tensors (``CheckpointSet``: a T5 and a CLIP-L, HiDream's four encoders, each read
group by group from its file, the disk tier reading unchanged groups straight from it). With
any other node after it, every file is read whole first (``materialize``): the same CLIP as
CLIPLoader's.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import comfy.sd
import folder_paths
import torch
from torch import nn

from ...offload_core import ConfigError
from ...offload_core.model import meta_build
from ...offload_core.sources.checkpoint import CheckpointIndex
from ...offload_core.sources.checkpoint_stream import CheckpointSet, CheckpointWeights, Converter
from ...offload_core.sources.load_trace import LoadTrace, header_state_dict
from ...seam.site import TEXT_ENCODER
from ..input_error import NodeInputError
from ..patcher.dynamic import give_lazy_layers_meta_weights
from ..patcher.patcher import ferry_patcher
from .core_quant_stream import convert_quants, not_streamable, reads_value

log = logging.getLogger("ferry")
META = torch.device("meta")


@dataclass(frozen=True)
class EncoderFile:
    """One text-encoder file: which of the network's tensors (state-dict names) it holds,
    under which of its keys."""

    path: str
    setting: str  # the widget that chose it (errors name it)
    keys: dict[str, str]  # network name -> file key
    #: network name of a QuantizedTensor -> the file keys of its inner tensors
    parts: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def weights(
        self, convert: Converter | None = None, changed: Callable[[str], bool] | None = None
    ) -> CheckpointWeights:
        index = CheckpointIndex.open(self.path, self.setting)
        return CheckpointWeights(index, self.keys, "", convert, changed, self.parts)

    @property
    def nbytes(self) -> int:
        return os.path.getsize(self.path)


@dataclass(frozen=True)
class LazyTextEncoder:
    """Where a lazy CLIP's encoder tensors are (``cond_stage_model.ferry_checkpoint``): each
    file is the source of its own tensors."""

    files: tuple[EncoderFile, ...]
    patch_prefix = ""  # a CLIP patcher's patch keys are the network's own names

    @property
    def path(self) -> str:
        """The largest file (the one the log names)."""
        return max(self.files, key=lambda f: f.nbytes).path

    def network(self, base: Any) -> nn.Module:
        return base  # a CLIP patcher's model is the text encoder itself

    def weights(
        self,
        net: nn.Module,
        convert: Converter | None = None,
        changed: Callable[[str], bool] | None = None,
    ) -> CheckpointWeights:
        """Every file as the layout's source, each of its own tensors."""
        if len(self.files) == 1:
            return self.files[0].weights(convert, changed)
        return CheckpointSet([f.weights() for f in self.files], convert, changed)

    def materialize(self, net: nn.Module, device: torch.device) -> None:
        for f in self.files:
            _read_whole(f, net, device)


def _read_whole(f: EncoderFile, net: nn.Module, device: torch.device) -> None:
    """Every tensor of ``f`` still on meta, read onto ``device``."""
    f.weights().materialize(net, device, only=lambda n: n in f.keys or n in f.parts)


def _with_plain_patcher(load: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` asking core for a plain (non-dynamic) patcher where it has the choice
    (v0.15+): Ferry owns the loading, as ``comfy_core.load_diffusion_model`` asks."""
    if "disable_dynamic" in inspect.signature(load).parameters:
        return {**kwargs, "disable_dynamic": True}
    return kwargs


def _core_load_clip(
    paths: list[str], clip_type: Any, model_options: dict[str, Any], embedding_directory: Any
) -> Any:
    """``comfy.sd.load_clip`` as CLIPLoader calls it (the whole files read into RAM)."""
    load = comfy.sd.load_clip
    kwargs = dict(
        ckpt_paths=paths,
        embedding_directory=embedding_directory,
        clip_type=clip_type,
        model_options=model_options,
    )
    return load(**_with_plain_patcher(load, kwargs))


def _core_build(
    sds: list[dict[str, torch.Tensor]],
    clip_type: Any,
    model_options: dict[str, Any],
    embedding_directory: Any,
) -> Any:
    """``comfy.sd.load_text_encoder_state_dicts`` as ``load_clip`` calls it."""
    load = comfy.sd.load_text_encoder_state_dicts
    kwargs = dict(
        embedding_directory=embedding_directory, clip_type=clip_type, model_options=model_options
    )
    return load(sds, **_with_plain_patcher(load, kwargs))


def lazy_clip(
    paths: list[tuple[str, str]],
    clip_type: Any,
    model_options: dict[str, Any],
    embedding_directory: Any,
) -> Any | None:
    """A CLIP whose encoders are on meta, their weights left in ``paths`` ((path, widget)
    pairs); None where core must convert a file in RAM (the caller loads it whole)."""
    indexes = []
    for path, setting in paths:
        try:
            index = CheckpointIndex.open(path, setting)
        except ConfigError as e:
            raise NodeInputError(setting, str(e).removeprefix(f"{setting}: ")) from None
        if not path.endswith(".safetensors"):
            return _not_lazy(path, "not a safetensors file")
        indexes.append(index)
    originals = [header_state_dict(index, read=reads_value) for index in indexes]
    sds = [dict(sd) for sd in originals]
    if model_options.get("custom_operations") is None:  # as load_clip converts them
        sds = [convert_quants(sd, dict(i.header.metadata))[0] for sd, i in zip(sds, indexes)]
    options = {**model_options, "initial_device": META}
    return traced_clip(
        paths, originals, lambda: _core_build(sds, clip_type, options, embedding_directory)
    )


#: ``fill(net, keys)``: gives a value to each tensor core computed from the file's own ones
#: (``keys``: each file's traced names -> keys), before the check that every tensor has one.
Fill = Callable[[nn.Module, list[dict[str, str]]], None]


def traced_clip(
    paths: list[tuple[str, str]],
    originals: list[dict[str, torch.Tensor]],
    build: Callable[[], Any],
    fill: Fill | None = None,
) -> Any | None:
    """The CLIP core's ``build()`` makes on meta from ``originals`` (each file of ``paths``
    as ``header_state_dict`` reads it), each of its tensors traced to the key it waits under;
    None where one cannot stay in its file (the log says why)."""
    trace = LoadTrace(originals)
    built: list[Any] = []
    try:
        with trace:
            built.append(build())
        net: nn.Module = built[0].cond_stage_model
        keys = trace.sources(net)
        parts = trace.inner_sources(net)
        meta_build.settle_on_meta(net, set().union(*keys))
        if fill is not None:
            fill(net, keys)
    except (RuntimeError, NotImplementedError, TypeError, ValueError, ConfigError) as e:
        return _not_lazy(paths[0][0], str(e))
    give_lazy_layers_meta_weights(net)
    why = not_streamable(net, {k: v for k_ in keys for k, v in k_.items()},
                         {k: v for p in parts for k, v in p.items()})  # fmt: skip
    if why is not None:
        return _not_lazy(paths[0][0], why)
    files = tuple(
        EncoderFile(path, setting, k, p)
        for (path, setting), k, p in zip(paths, keys, parts)
        if k or p
    )
    quant = [f.path for f in files if f.parts]
    if quant:
        log.info("ferry: %s (ComfyUI's quantized formats) stay in their files", ", ".join(quant))
    net.ferry_checkpoint = LazyTextEncoder(files)  # type: ignore[assignment]
    return built[0]


def _not_lazy(path: str, why: str) -> None:
    log.info("ferry: %s cannot stay in its file (%s); loading it whole", path, why)
    return None


def text_encoder_paths(files: dict[str, str]) -> list[tuple[str, str]]:
    """(path, widget) of each chosen file ({widget: name in models/text_encoders})."""
    paths = []
    for widget, name in files.items():
        path = folder_paths.get_full_path("text_encoders", name)
        if path is None:
            raise NodeInputError(widget, f"{name!r} is not in models/text_encoders")
        paths.append((path, widget))
    return paths


def load_text_encoder(files: dict[str, str], clip_type: Any, model_options: dict[str, Any]) -> Any:
    """The Ferry loader's CLIP from ``files`` ({widget: name in models/text_encoders}): its
    encoders' weights left in the files where core needs no conversion of them, else core's
    own CLIP loaded whole (the log says why). Either way its patcher is Ferry's with no
    offload, so a plain load reads the weights whole, as CLIPLoader does."""
    paths = text_encoder_paths(files)
    embeddings = folder_paths.get_folder_paths("embeddings")
    clip = lazy_clip(paths, clip_type, model_options, embeddings)
    if clip is None:
        log.warning(
            "ferry: %s needs ComfyUI's own conversion, so it is loaded whole into RAM; save it "
            "in ComfyUI's plain layout (safetensors, no key it transposes) to run "
            "it bigger than RAM",
            ", ".join(p for p, _ in paths),
        )
        clip = _core_load_clip([p for p, _ in paths], clip_type, model_options, embeddings)
    ferry_patcher(clip.patcher, TEXT_ENCODER)
    return clip
