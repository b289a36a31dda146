"""The browser side of the pack: the ComfyUI frontend extension (web/comfyui) and the Gradio
panel (web/panel). Importing this package imports nothing else (no gradio)."""
