"""Node "Ferry Offload Text Encoder": CLIP -> CLIP whose text encoder streams through Ferry.

The same settings, checks and ModelPatcher binding as Ferry Offload Model (offload_node.py,
patcher.py), applied to the CLIP's own patcher (``clip.patcher``, whose model is the text
encoder: text_encoder_patcher.py). The layout happens when CLIPTextEncode loads the encoder;
the conditioning is the same as without Ferry, to the bit.
"""

from __future__ import annotations

from typing import Any

from comfy_api.latest import io, ui

from ..offload_core import OffloadKind
from .auto_settings import remember
from .config import FerryConfig
from .dynamic import DYNAMIC_VRAM_HELP
from .offload_inputs import setting_inputs
from .offload_node import FerryOffloadModel, auto_policy, check_against_model
from .patcher import ferry_clone
from .text_encoder_patcher import TextEncoderPatcherMixin

NODE_ID = "FerryOffloadTextEncoder"  # stable forever: saved workflows refer to it


class FerryOffloadTextEncoder(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=NODE_ID,
            display_name="Ferry Offload Text Encoder",
            category="Ferry",
            description=(
                "Streams the text encoder's layers group by group while it encodes, from pinned "
                "RAM, RAM or disk, as Ferry Offload Model does for the diffusion model. Put it "
                "right after the CLIP loader; every encoder of a dual/triple CLIP is offloaded."
            ),
            inputs=[
                io.Clip.Input("clip", tooltip="The text encoder (CLIP) to offload."),
                *setting_inputs(),
            ],
            outputs=[io.Clip.Output(tooltip="The same text encoder; it loads through Ferry.")],
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],  # "auto": Ferry Offload Model's
        )

    @classmethod
    def fingerprint_inputs(cls, use_panel_settings: bool, **kwargs: object) -> object:
        return FerryOffloadModel.fingerprint_inputs(use_panel_settings, **kwargs)

    @classmethod
    def validate_inputs(
        cls,
        use_panel_settings: bool,
        tier: str,
        vram_budget: str,
        disk_path: str,
        blocks_per_group: str = "auto",
        prefetch_depth: str = "auto",
    ) -> bool | str:
        return FerryOffloadModel.validate_inputs(
            use_panel_settings, tier, vram_budget, disk_path, blocks_per_group, prefetch_depth
        )

    @classmethod
    def execute(cls, clip: Any, use_panel_settings: bool, **widgets: Any) -> io.NodeOutput:
        # The widgets are Ferry Offload Model's (the same names, defaults and checks).
        name = text_encoder_name(clip)
        policy, choice = auto_policy(
            cls.hidden, use_panel_settings, widgets, clip.cond_stage_model, name, "text_encoder"
        )
        config = FerryConfig(policy, name=name, kind=OffloadKind.TEXT_ENCODER)
        remember(config.title, choice)
        patcher = ferry_clone(clip.patcher, config, TextEncoderPatcherMixin)
        if patcher is None:  # left to ComfyUI's dynamic VRAM; the log says why, with the flag
            return io.NodeOutput(clip, ui=ui.PreviewText(DYNAMIC_VRAM_HELP.format(why="")))
        check_against_model(patcher, config, use_panel_settings)
        out = clip.clone()
        # Under dynamic VRAM the patcher is the non-dynamic delegate's, over its own encoder:
        # the CLIP must encode with that one.
        out.patcher, out.cond_stage_model = patcher, patcher.model
        return io.NodeOutput(out)


def text_encoder_name(clip: Any) -> str:
    """The name on the encoder's line in the sidebar, the panel and the log (after its kind:
    "text encoder: clip_l + t5xxl"): the encoders the CLIP holds, by the names core gives
    them, or its class where it holds none by name."""
    te = clip.cond_stage_model
    encoders = [name for name, _ in te.named_children()]
    return " + ".join(encoders) if encoders else type(te).__name__
