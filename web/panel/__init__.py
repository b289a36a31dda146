"""Ferry's Gradio panel: live VRAM/RAM, offload settings without code, and the planner.

    from .web.panel import launch_panel      # inside the pack (ComfyUI)
    url = launch_panel()                     # http://127.0.0.1:7860/ ; a second call returns it again

Importing this package imports neither gradio nor torch's CUDA: gradio is imported when the
panel starts.
"""

from .server import close_panel, launch_panel, panel_context, panel_url

__all__ = ["close_panel", "launch_panel", "panel_context", "panel_url"]
