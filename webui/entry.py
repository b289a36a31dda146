"""What scripts/ferry_webui.py runs inside a WebUI: the Ferry tab, the route, the script class.

The only file of webui/ that imports the WebUI's own modules (``modules.*``, Forge's
``backend``), and only when ``load()`` runs inside one:

- Forge (Gradio 4.40, ``backend.patcher``): the panel tab, ``GET /ferry/stats``, and the
  "Ferry offload" script class, which the WebUI registers from scripts/ferry_webui.py.
- A WebUI without Forge's backend (A1111, reForge): no offload (it needs Forge's patcher); the
  tab is the panel where its Gradio can draw it, else a notice saying so (webui_tab.py); one
  console line says what to use instead.
- Not inside a WebUI (tests, a plain ``python``): nothing.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from ..seam.site import DIFFUSION_MODEL
from ..web.panel.webui_tab import register_tab, say_once
from .live_layout import ForgeLayout, layouts_of
from .routes import add_routes
from .script import Host, script_class

SAVED_NOTE = (
    "the Ferry offload accordion reads it with *Use saved settings* on, and so do ComfyUI's "
    "Ferry nodes with *use panel settings*."
)
APPLY_NOTE = (
    "**Apply** releases the UNet's layout; the next generation lays it out again with the "
    "accordion's settings (the saved ones with *Use saved settings* on). The same for the text "
    "encoder's, where *Offload the text encoder too* is on."
)
NO_FORGE = (
    "Ferry: the offload accordion needs Stable Diffusion WebUI Forge (it drives Forge's UNet "
    "patcher); this WebUI has no Forge backend, so only the Ferry tab is added. To offload, "
    "use Ferry in Forge or in ComfyUI."
)


def load() -> type | None:
    """Registers Ferry with the running WebUI; returns the script class (Forge) or None."""
    try:
        from modules import script_callbacks  # type: ignore[import-not-found]
    except ImportError:
        return None  # not inside a WebUI
    import gradio

    host = forge_host(gradio)
    options = forge_panel_options() if host is not None else {}
    if not register_tab(script_callbacks, gradio.__version__, **options):
        return None  # too old a Gradio: the tab says why, nothing else of Ferry runs
    if host is None:
        say_once(NO_FORGE)
        return None
    script_callbacks.on_app_started(functools.partial(add_routes, host=host))
    return script_class(host)


def forge_host(gradio: Any) -> Host | None:
    """Forge's parts the script needs, or None in a WebUI without Forge's backend."""
    try:
        import backend.patcher.unet  # type: ignore[import-not-found]  # noqa: F401
        from modules import paths_internal, scripts  # type: ignore[import-not-found]
        from modules.ui_components import InputAccordion  # type: ignore[import-not-found]
    except ImportError:
        return None
    return Host(
        script_base=scripts.Script,
        always_visible=scripts.AlwaysVisible,
        gr=gradio,
        input_accordion=InputAccordion,
        default_disk_path=os.path.join(paths_internal.data_path, "ferry-offload"),
        loaded_model=loaded_model,
    )


def loaded_model() -> Any:
    """The checkpoint Forge has loaded, or None: ``model_data.sd_model`` never loads one
    (``shared.sd_model`` does, when none is). Forge's stand-in before the first load has no
    ``forge_objects``: webui/plan.py says "no checkpoint" for it."""
    from modules import sd_models  # type: ignore[import-not-found]

    return sd_models.model_data.sd_model


def forge_panel_options() -> dict[str, Any]:
    """The panel's hooks into Forge: the loaded UNet to plan on, busy while generating, and
    Apply as a release (the next generation lays the UNet out with its accordion)."""
    from modules import sd_models, shared  # type: ignore[import-not-found]

    def reference() -> Any:
        model = sd_models.model_data.sd_model  # never loads one (shared.sd_model may)
        unet = getattr(getattr(model, "forge_objects", None), "unet", None)
        if unet is None:
            return None
        return ForgeLayout.of_patcher(unet.model, DIFFUSION_MODEL).twin_plans()

    def is_busy() -> bool:
        return bool(shared.state.job_count)

    return {
        "reference": reference,
        "is_busy": is_busy,
        "reapply_hook": release_from_panel,
        "saved_note": SAVED_NOTE,
        "apply_note": APPLY_NOTE,
    }


def release_from_panel(handle: Any, policy: Any) -> str:
    """The panel's Apply in Forge: the layout belongs to the accordion's settings, so Apply
    releases it and the next generation lays the UNet out again (with the saved settings
    where Use saved settings is on)."""
    from modules import sd_models  # type: ignore[import-not-found]

    name = getattr(handle, "name", "model")
    for layout in layouts_of(sd_models.model_data.sd_model):  # the UNet's, the text encoder's
        if layout.handle is handle and layout.release():
            return (
                f"{name}: released; the next generation lays it out with the accordion's settings"
            )
    return f"{name}: not laid out by the Ferry offload accordion; left as it is"
