"""Ferry inside Stable Diffusion WebUI Forge: the "Ferry offload" accordion and its patcher.

The WebUI host beside nodes/ (ComfyUI's): it drives the same offload_core through Forge's own
UNet patcher (a subclass, as nodes/ subclasses ComfyUI's ModelPatcher) and shows the same panel
(web/panel/) as a tab. Neither host imports the other's code. Forge's modules are imported only
by entry.py, inside a running WebUI; the rest is plain Python that CI tests with stand-ins.
scripts/ferry_webui.py (which Forge loads as a WebUI script) calls ``entry.load()``.
"""
