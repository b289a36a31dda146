"""ComfyUI side of Ferry: the nodes, the ModelPatcher integration and the /ferry/ routes.

Importing this package imports nothing: the modules that need ComfyUI (extension, *_node,
patcher, routes, quant_loader) are imported by the pack's comfy_entrypoint; the rest (config,
live_layout, stats, report, api, pusher) is plain Python that CI tests import directly.
"""
