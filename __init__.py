"""Ferry's ComfyUI entry point: the V3 extension and the frontend folder. Nothing else.

ComfyUI imports this file as a package named after its folder (with hyphens, from
ComfyUI-Manager), so everything inside uses relative imports. Importing it starts no thread,
imports neither torch nor gradio, and touches no GPU; ComfyUI calls ``comfy_entrypoint``.
No NODE_CLASS_MAPPINGS here: ComfyUI ignores comfy_entrypoint where a module has one.
"""

from __future__ import annotations

from typing import Any

# Every .js under this folder is served at /extensions/<pack folder>/ and loaded by the page.
# Not "./web": the Gradio panel lives in web/panel and must not be loaded as an extension.
WEB_DIRECTORY = "./web/comfyui"


async def comfy_entrypoint() -> Any:
    from .nodes.extension import FerryExtension

    return FerryExtension()


__all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
