"""Node "Ferry Offload Model": MODEL -> MODEL whose diffusion model streams through Ferry.

Thin: one call has its widgets parsed, "auto" planned with the whole prompt and the choice
applied as a typed value (planning/offload_policy.py); the policy is validated against the
model (the plan; the disk folder) before any weight moves, and a Ferry clone returned
(patcher.py). The layout itself
happens when ComfyUI loads the model for sampling.
"""

from __future__ import annotations

import logging
import os
from typing import Any, ClassVar

from comfy_api.latest import io, ui

from ..offload_core.model.layout import module_nbytes
from ..offload_core.policy import AUTO
from ..seam.model_files import gguf_file_of
from ..seam.site import DIFFUSION_MODEL, NetworkSite
from .input_error import NodeInputError
from .offload_inputs import NodeText, offload_schema
from .patcher.comfy_core import core_copies_model_files
from .patcher.dynamic import DYNAMIC_VRAM_HELP
from .patcher.patcher import ferry_clone
from .planning.config import ComfyOffload, NodeSettings, check_disk_folder
from .planning.graph_plan import find_model_file
from .planning.loader_files import copy_note, loader_files, named_files, upstream_loader
from .planning.offload_policy import (
    check_against_model,
    default_disk_path,
    node_policy,
    settings_fingerprint,
)

log = logging.getLogger("ferry")
NODE_ID = "FerryOffloadModel"  # stable forever: saved workflows refer to it


class FerryOffloadNode(io.ComfyNode):
    """What every Ferry offload node does the same way, whatever network it offloads: its
    schema (the network in, Ferry Offload Model's settings, the network out), the widgets'
    checks, "auto" planned for the prompt, the Ferry clone checked against the network before
    any weight moves. A node is its ``SITE`` (seam/site.py) and its ``TEXT``."""

    SITE: ClassVar[NetworkSite]
    TEXT: ClassVar[NodeText]

    @classmethod
    def define_schema(cls) -> io.Schema:
        return offload_schema(cls.TEXT, cls.SITE.control, cls.SITE.bakes)

    @classmethod
    def execute(cls, use_panel_settings: bool, **inputs: Any) -> io.NodeOutput:
        """The node's input with its network loading through Ferry as its widgets (the rest
        of ``inputs``; use_panel_settings: the panel's saved settings) say."""
        site = cls.SITE
        obj = inputs.pop(site.control)
        network = site.network_of(getattr(site.patcher_of(obj), "model", None))
        name, widgets = cls.name_of(obj), None if use_panel_settings else inputs
        policy, choice = node_policy(cls.hidden, widgets, network, name, site.planner_kind)
        config = ComfyOffload(
            policy, name=name, kind=site.kind, why=None if choice is None else choice.reason
        ).with_source_checkpoint(cls.source_of(obj) or cls.loaded_from(obj))  # read in place
        cls.say_if_the_loader_copied(obj)
        out = ferry_clone(obj, config, site)
        if out is None:  # left to ComfyUI's dynamic VRAM; the log says why, once, with the flag
            return io.NodeOutput(obj, ui=ui.PreviewText(DYNAMIC_VRAM_HELP.format(why="")))
        check_against_model(site.patcher_of(out), config, use_panel_settings)
        return io.NodeOutput(out)

    @classmethod
    def name_of(cls, obj: Any) -> str:
        """The name on the network's line (after its kind): its class, as core names it."""
        net = cls.SITE.network_of(getattr(cls.SITE.patcher_of(obj), "model", None))
        return type(net).__name__ if net is not None else cls.SITE.what

    @classmethod
    def source_of(cls, obj: Any) -> str | None:
        """The file the network's weights are in as they are (None: none Ferry reads)."""
        return None

    @classmethod
    def loaded_from(cls, obj: Any) -> str | None:
        """The file the core loader before this node read the network from, by the prompt's
        inputs (planning/loader_files.py); the disk tier reads the groups that are still
        that file's bytes from it. None where it is not one file."""
        hidden = getattr(cls, "hidden", None)
        files = loader_files(
            getattr(hidden, "prompt", None),
            getattr(hidden, "unique_id", None),
            cls.SITE.control,
            find_model_file,
        )
        return files[0] if len(files) == 1 else None

    @classmethod
    def say_if_the_loader_copied(cls, obj: Any) -> None:
        """Where this core's loader before the node read the file whole into RAM first,
        the log says what that cost at the loader's peak, and which of Ferry's loaders
        avoids it."""
        if not core_copies_model_files():
            return
        hidden = getattr(cls, "hidden", None)
        found = upstream_loader(
            getattr(hidden, "prompt", None), getattr(hidden, "unique_id", None), cls.SITE.control
        )
        files = named_files(found, find_model_file) if found is not None else ()
        if not files or found is None:
            return
        network = cls.SITE.network_of(getattr(cls.SITE.patcher_of(obj), "model", None))
        held = module_nbytes(network) if network is not None else 0
        size = sum(os.path.getsize(f) for f in files)
        log.warning("ferry: %s", copy_note(found[0], files, size, held))

    @classmethod
    def fingerprint_inputs(cls, use_panel_settings: bool, **kwargs: object) -> object:
        # With the panel's settings, or "auto" (planned under the saved budgets), the node
        # must run again when the settings file changes: a new budget applies next prompt.
        try:
            auto = NodeSettings.parse(kwargs).auto
        except NodeInputError:
            auto = False  # execute() reports it
        return settings_fingerprint() if use_panel_settings or auto else ""

    @classmethod
    def validate_inputs(
        cls,
        use_panel_settings: bool,
        tier: str,
        vram_budget: str,
        disk_path: str,
        blocks_per_group: str = AUTO,
        prefetch_depth: str = AUTO,
    ) -> bool | str:
        # What needs no model is checked before the prompt is queued: a node error at once.
        # The settings on "auto" are the plan's, made with the model: nothing said of them.
        if use_panel_settings:
            return True  # the widgets are ignored; execute() checks the panel's settings
        widgets = {"tier": tier, "vram_budget": vram_budget, "disk_path": disk_path,
                   "blocks_per_group": blocks_per_group, "prefetch_depth": prefetch_depth}  # fmt: skip
        try:
            settings = NodeSettings.parse(widgets)
            if settings.wish.tier == "disk":
                check_disk_folder(settings.disk_folder(default_disk_path()))
        except NodeInputError as e:
            return str(e)
        return True


class FerryOffloadModel(FerryOffloadNode):
    SITE = DIFFUSION_MODEL
    TEXT = NodeText(
        NODE_ID, "Ferry Offload Model",
        "Streams the model's blocks to the GPU group by group while it runs, from pinned "
        "RAM, RAM or disk, so models bigger than your VRAM (or RAM) run at close to full "
        "speed. Put it right after the model loader; LoRA and other nodes can follow it.",
        io.Model, DIFFUSION_MODEL.kind.label,
        "The diffusion model to offload. From UNETLoader the whole model is in RAM first (the "
        "peak happens at the loader); from Ferry Load Diffusion Model (quant_preset none) it "
        "streams from its file: models bigger than RAM.",
    )  # fmt: skip

    @classmethod
    def source_of(cls, obj: Any) -> str | None:
        if getattr(obj, "patches", None):
            return None  # patched weights are not the file's
        # Weights as in their file: the disk tier may read groups from it, not write copies.
        source = getattr(obj, "ferry_source_checkpoint", None)
        if source is None and hasattr(getattr(obj, "model", None), "diffusion_model"):
            source = gguf_file_of(obj.model.diffusion_model)  # UnetLoaderGGUF's file
        return source  # type: ignore[no-any-return]
