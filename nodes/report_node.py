"""Node "Ferry Memory Report": RAM, VRAM and every live offload's numbers, as text."""

from __future__ import annotations

import time
from typing import Any

from comfy_api.latest import io, ui

from ..offload_core import ConfigError, device_memory, process_memory
from ..offload_core.tools.monitor import default_device
from .ui.report import report_text
from .ui.stats import current_offloads, observe_prompt, running_prompt_id

NODE_ID = "FerryMemoryReport"


class FerryMemoryReport(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=NODE_ID,
            display_name="Ferry Memory Report",
            category="Ferry",
            description="Shows RAM, VRAM and, per offloaded model, where its weights are, the "
            "bytes moved, GB/s and stall time.",
            inputs=[
                io.AnyType.Input(
                    "after",
                    optional=True,
                    tooltip="Connect anything (e.g. the sampler's LATENT) to take the report "
                    "after that node ran.",
                ),
                io.Model.Input(
                    "model",
                    optional=True,
                    tooltip="A model through Ferry Offload Model: adds its plan (groups, "
                    "device bytes) to the report.",
                ),
            ],
            outputs=[io.String.Output("report", tooltip="The report as text.")],
            is_output_node=True,
        )

    @classmethod
    def fingerprint_inputs(cls, **kwargs: Any) -> Any:
        return time.time()  # memory changes between runs: never reuse a cached report

    @classmethod
    def execute(cls, after: Any = None, model: Any = None) -> io.NodeOutput:
        device = default_device()
        dev = device_memory(device) if device else None
        samples = current_offloads()
        observe_prompt(running_prompt_id(), samples)  # this prompt's disk reads, per network
        offloads = [o.stats for o in samples if "error" not in o.stats]
        plan_text = None
        cfg = getattr(model, "ferry_offload", None)
        if cfg is not None:
            try:
                plan_text = model._ferry_layout().plan(cfg, model.load_device).describe()
            except ConfigError as e:
                plan_text = f"(no plan: {e})"
            # What ComfyUI's model manager believes (the suite checks it matches Ferry's).
            plan_text += (
                f"\n  ComfyUI accounting: loaded {model.loaded_size()} bytes, "
                f"model_size {model.model_size()} bytes"
            )
        text = report_text(process_memory(), dev, device, offloads, plan_text)
        return io.NodeOutput(text, ui=ui.PreviewText(text))
