"""The "Ferry offload" script: an always-visible accordion in txt2img and img2img.

``script_class(host)`` builds the ``scripts.Script`` subclass from the host's parts (Forge's
``modules.scripts``, its Gradio, its ``InputAccordion``), so this file imports neither Forge
nor Gradio and CI builds it against stand-ins. Before every sampling the script hands Forge a
Ferry clone of the UNet's patcher (as Forge's built-in FreeU hands it a patched clone), or
does nothing when the accordion is off: Forge's own path, untouched. With "Offload the text
encoder too" ticked it also hands Forge a Ferry clone of the CLIP before each batch's prompts
are encoded (``process_batch``, right before ``setup_conds``) and again before every sampling
(the hires pass encodes its prompts after the first pass's sampling began).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..offload_core import BlockLevel, ConfigError, FerryError, OffloadPolicy, RamTier
from ..offload_core.planner import Choice
from ..offload_core.policy import AUTO
from ..offload_core.tools.settings_file import load_settings
from ..seam.choices import level_choices, tier_choices
from ..seam.offload import HeldOffload
from ..seam.site import DIFFUSION_MODEL, TEXT_ENCODER, NetworkSite
from .auto_plan import DEFAULT_CFG, DEFAULT_STEPS, loaded_networks, plan_for, unet_reads
from .controls import (
    CONTROLS,
    DEFAULTS,
    INFOTEXT_KEY,
    LABELS,
    SECTION,
    TEXT_ENCODER_INFOTEXT,
    Asked,
    ControlError,
    ForgeOffload,
    as_control_error,
    asked_from_controls,
    check_blocks,
    check_folder,
    parse_infotext,
    switched_on,
)
from .live_layout import COUNTS, ForgeLayout
from .low_bit import check_weights
from .patcher import FerryPatcherMixin, ferry_clone, mark_engine_passes
from .plan import plan_text
from .plan_button import SLIDERS, PlanButton

#: The longest run of blocks of the models Forge runs (Flux's 38 single blocks), said in the
#: Blocks per group box's help. A model with fewer is refused with its own maximum.
MAX_BLOCKS = 38
AUTO_TIER_LABEL = "Auto (Ferry chooses)"

INTRO = (
    "Ferry keeps part of the UNet on the GPU and streams the rest in just before it is needed, "
    "from RAM or from disk; the image is the same as without it."
)
GPU_WEIGHTS_NOTE = (
    "While Ferry is on, Forge's **GPU Weights** slider no longer decides how much of the UNet "
    "sits on the GPU: the **VRAM budget** here does. GPU Weights still sets the room Forge "
    "keeps free for computing (total VRAM − GPU Weights) and still places the VAE, and the "
    "text encoder unless it goes through Ferry too. The disk folder is not written into the "
    "image's parameters."
)
PLAN_LABEL = "Plan: where would Ferry put this checkpoint?"
TEXT_ENCODER_INFO = (
    "The CLIP / T5 text encoders stream the same way, with the settings above, while Forge "
    "encodes the prompt. Forge has read them whole into RAM when it loaded the checkpoint: "
    "this saves VRAM (and RAM on the disk tier, after the first encode), not the load's RAM."
)


@dataclass(frozen=True)
class Host:
    """What the script needs from the WebUI: Forge passes its own modules (scripts/ferry_webui.py)."""

    script_base: type  # modules.scripts.Script
    always_visible: Any  # modules.scripts.AlwaysVisible
    gr: Any  # the host's gradio module
    input_accordion: Callable[..., Any]  # modules.ui_components.InputAccordion
    default_disk_path: str  # the disk tier's folder when the Disk folder box is empty
    load_saved: Callable[[], Any] = load_settings
    #: The checkpoint Forge has loaded now, or None; never loads one (the Plan button).
    loaded_model: Callable[[], Any] = lambda: None


@dataclass(frozen=True)
class Words:
    """How the accordion's messages name one kind of network: ``what`` (its weights),
    ``blocks_of`` (where its blocks are counted), ``cut`` (the control for a network Ferry
    cannot cut: no block list at block level, ...)."""

    forge_object: str  # the attribute of ``p.sd_model.forge_objects`` that holds it
    what: str
    blocks_of: str
    cut: str
    infotext: str = ""  # added to the image's "Ferry" parameter


#: The networks the accordion offloads, in the order their prompts and samplings load them.
NETWORKS: dict[NetworkSite, Words] = {
    TEXT_ENCODER: Words("clip", "the text encoder", "the text encoder", "text_encoder",
                        TEXT_ENCODER_INFOTEXT),
    DIFFUSION_MODEL: Words("unet", "this UNet", "this model", "level"),
}  # fmt: skip


def line_name(p: Any, site: NetworkSite, network: Any) -> str:
    """The name on the network's line: the checkpoint's for the UNet; for a text encoder the
    encoders Forge's JointTextEncoder holds (its children), as ComfyUI's are ("text encoder:
    clip_l + clip_g"), since the registry would number a second line of the same name."""
    if site is DIFFUSION_MODEL:
        info = getattr(p.sd_model, "sd_checkpoint_info", None)
        return getattr(info, "model_name", None) or "unet"
    return " + ".join(name for name, _ in network.named_children())


def requested(
    p: Any, values: tuple[Any, ...], host: Host, site: NetworkSite
) -> ForgeOffload | None:
    """The offload the accordion asks for on ``p``'s network at ``site``, not yet checked
    against it; None when Ferry is off (or that network's switch is). Controls on "auto" take
    the planner's choice for this generation's networks, steps and CFG (webui/auto_plan.py:
    the plan the Plan button shows)."""
    if site.forge_control != "enabled" and not switched_on(values, site.forge_control):
        return None
    asked = asked_from_controls(
        values, default_disk_path=host.default_disk_path, load_saved=host.load_saved
    )
    if asked is None:
        return None
    obj = getattr(p.sd_model.forge_objects, NETWORKS[site].forge_object)
    name = line_name(p, site, site.network_of(site.patcher_of(obj).model))
    try:
        choice = auto_choice(p, values, asked, site) if asked.planned else None
        policy = asked.policy(choice)
    except ConfigError as e:
        raise as_control_error(e, saved=asked.from_saved) from None
    offload = ForgeOffload(policy, name, site.kind, from_saved=asked.from_saved)
    info = getattr(p.sd_model, "sd_checkpoint_info", None)
    return offload.with_source_checkpoint(getattr(info, "filename", None))


def auto_choice(p: Any, values: tuple[Any, ...], asked: Asked, site: NetworkSite) -> Choice:
    """The planner's choice for ``p``'s network at ``site``, planned with every network the
    accordion offloads on this generation (raises the plan's refusal, a ConfigError)."""
    nets = loaded_networks(p.sd_model, switched_on(values, "text_encoder"))
    assert nets is not None, "a generation runs a loaded checkpoint"
    reads = unet_reads(getattr(p, "steps", DEFAULT_STEPS), getattr(p, "cfg_scale", DEFAULT_CFG))
    plan = plan_for(p.sd_model, nets, asked, reads).check()
    return plan.choices[[kind for kind, _ in nets].index(site.kind)]


def offload_for(
    p: Any, values: tuple[Any, ...], host: Host, site: NetworkSite
) -> ForgeOffload | None:
    """The offload the accordion asks for on ``p``'s network at ``site``, validated against
    it (nothing moves); None when off. Raises ControlError naming the control."""
    offload = requested(p, values, host, site)
    if offload is None:
        return None
    words = NETWORKS[site]
    patcher = site.patcher_of(getattr(p.sd_model.forge_objects, words.forge_object))
    layout = ForgeLayout.of_patcher(patcher.model, site)
    device = patcher.load_device
    # Forge's own weight types first (GGUF runs, bnb 4-bit where its state is): low_bit.py.
    check_weights(layout.module, device, what=words.what, control=site.forge_control or "")
    try:
        # Blocks per group first, in the accordion's words: the network's longest run of blocks.
        probe = HeldOffload(OffloadPolicy(level=BlockLevel(1), tier=RamTier()), offload.name)
        check_blocks(offload, layout.plan(probe, device).max_blocks_per_group, words.blocks_of)
        layout.plan(offload, device)
    except ConfigError as e:
        raise as_control_error(e, saved=offload.from_saved) from None
    check_folder(offload)
    return offload


def refuse(p: Any, err: ControlError, site: NetworkSite) -> str:
    """The generation will stop at the load of ``p``'s network at ``site`` with ``err``
    (before any weight moves); returns the message, printed and counted (/ferry/stats)."""
    objects, attr = p.sd_model.forge_objects, NETWORKS[site].forge_object
    setattr(objects, attr, ferry_clone(getattr(objects, attr), None, site, refusal=err))
    print(f"{SECTION}: refused: {err}")
    COUNTS["refusals"] += 1
    COUNTS["last_refusal"] = str(err)
    return str(err)


def hand_over(p: Any, values: tuple[Any, ...], host: Host, site: NetworkSite) -> str | None:
    """Puts a Ferry clone of ``p``'s network at ``site`` in ``p.sd_model.forge_objects`` (or
    one that refuses to load, naming the control); returns the refusal's message, if any.
    Forge loads it next (the UNet for sampling; the CLIP's patcher in
    ``get_learned_conditioning``)."""
    objects, words = p.sd_model.forge_objects, NETWORKS[site]
    obj = getattr(objects, words.forge_object, None)
    if obj is None:
        return None
    try:
        offload = offload_for(p, values, host, site)
    except ControlError as e:
        return refuse(p, e, site)
    except FerryError as e:
        return refuse(p, ControlError(words.cut, str(e)), site)
    if offload is None:
        return None
    patcher = site.patcher_of(obj)
    if not (isinstance(patcher, FerryPatcherMixin) and patcher.ferry_offload == offload):
        setattr(objects, words.forge_object, ferry_clone(obj, offload, site))
    mark_engine_passes(p.sd_model, site.network_of(patcher.model), site.passes)
    p.extra_generation_params[INFOTEXT_KEY] = offload.infotext() + words.infotext
    return None


def accordion(host: Host, is_img2img: bool, plan: PlanButton | None = None) -> list[Any]:
    """The controls, in ``CONTROLS`` order; ``plan``: the Plan button's wiring (with Forge's
    Steps and CFG sliders where the script watches them; None: at once, without)."""
    gr = host.gr
    tab = "img2img" if is_img2img else "txt2img"
    with host.input_accordion(False, label=SECTION, elem_id=f"{tab}_ferry_offload") as enabled:
        gr.Markdown(INTRO)
        with gr.Row():
            level = gr.Radio(
                level_choices(), value=DEFAULTS["level"], label="How to cut the UNet",
                elem_id=f"{tab}_ferry_level",
            )  # fmt: skip
            # Text boxes, not sliders, so they can hold "auto" (and an infotext's number).
            blocks = gr.Textbox(
                value=DEFAULTS["blocks_per_group"], label="Blocks per group",
                elem_id=f"{tab}_ferry_blocks",
                info="auto: Ferry sizes the groups for this machine; or a number: blocks moved "
                f"together (more is faster and needs more VRAM; SD 1.5 has up to 12 in a row, "
                f"SDXL 9, Flux {MAX_BLOCKS}).",
            )  # fmt: skip
        with gr.Row():
            tier = gr.Radio(
                [(AUTO_TIER_LABEL, AUTO), *tier_choices()], value=DEFAULTS["tier"],
                label="Where the rest waits", elem_id=f"{tab}_ferry_tier",
            )  # fmt: skip
            disk_path = gr.Textbox(
                value=DEFAULTS["disk_path"], label="Disk folder", placeholder=host.default_disk_path,
                elem_id=f"{tab}_ferry_disk_path",
                info="For the disk tier (auto may choose it): a folder on your fastest disk "
                "(empty: the folder shown). Groups read from the checkpoint itself write nothing.",
            )  # fmt: skip
        with gr.Row():
            prefetch = gr.Textbox(
                value=DEFAULTS["prefetch_depth"], label="Look-ahead",
                elem_id=f"{tab}_ferry_prefetch",
                info="auto: as deep as hides the reads on this machine; or 1..8 groups loaded "
                "ahead of the one computing (2 or more hides a slow disk).",
            )  # fmt: skip
            budget = gr.Textbox(
                value=DEFAULTS["vram_budget"], label=LABELS["vram_budget"],
                elem_id=f"{tab}_ferry_vram_budget",
                info="auto: keep what fits in free VRAM; a number of GiB; empty: stream every group.",
            )  # fmt: skip
        use_saved = gr.Checkbox(
            value=DEFAULTS["use_saved"], elem_id=f"{tab}_ferry_use_saved",
            label="Use saved settings (the Ferry tab's Save, shared with ComfyUI; the controls "
            "above are then ignored)",
        )  # fmt: skip
        controls = (enabled, level, blocks, tier, disk_path, prefetch, budget, use_saved)
        return foot(host, tab, plan or PlanButton(), *controls)


def foot(host: Host, tab: str, plan: PlanButton, *controls: Any) -> list[Any]:
    """The accordion's last control (the text-encoder box), its note, and the Plan button with
    the Markdown it fills (webui/plan.py); returns every control (``controls``: the others).
    The button and its text are no controls: the script's values stay the nine of
    ``CONTROLS``; the click also reads Forge's Steps and CFG sliders (``plan``)."""
    gr = host.gr
    text_encoder = gr.Checkbox(
        value=DEFAULTS["text_encoder"], elem_id=f"{tab}_ferry_text_encoder",
        label=LABELS["text_encoder"], info=TEXT_ENCODER_INFO,
    )  # fmt: skip
    gr.Markdown(GPU_WEIGHTS_NOTE)
    every = [*controls, text_encoder]
    button = gr.Button(PLAN_LABEL, elem_id=f"{tab}_ferry_plan", size="sm")
    shown = gr.Markdown("", elem_id=f"{tab}_ferry_plan_text")

    def show(*values: Any) -> str:
        sliders = dict(zip(SLIDERS, values[len(every) :]))
        return plan_text(
            host.loaded_model(), values[: len(every)], default_disk_path=host.default_disk_path,
            load_saved=host.load_saved, **sliders,
        )  # fmt: skip

    def connect(sliders: list[Any]) -> None:
        button.click(show, inputs=[*every, *sliders], outputs=[shown], show_progress="minimal")

    plan.wire(connect)
    return every


def infotext_fields(controls: list[Any]) -> list[tuple[Any, Callable[[dict[str, Any]], Any]]]:
    """Pasting an image's parameters sets the controls back (Ferry off when it was off)."""

    def field(cid: str) -> Callable[[dict[str, Any]], Any]:
        def read(params: dict[str, Any]) -> Any:
            got = parse_infotext(params.get(INFOTEXT_KEY))
            if got is None:
                return False if cid == "enabled" else None  # None: leave the control as it is
            return got.get(cid)

        return read

    return [(c, field(cid)) for c, (cid, _) in zip(controls, CONTROLS) if cid != "disk_path"]


def script_class(host: Host) -> type:
    """The ``scripts.Script`` subclass Forge loads (scripts/ferry_webui.py exports it)."""

    class FerryOffloadScript(host.script_base):  # type: ignore[misc,name-defined]
        sorting_priority = 15

        def title(self) -> str:
            return SECTION

        def show(self, is_img2img: bool) -> Any:
            # Before Forge builds its UI: the Plan button reads its Steps and CFG sliders.
            self.plan_button = PlanButton()
            self.plan_button.watch(self, "img2img" if is_img2img else "txt2img")
            return host.always_visible

        def ui(self, is_img2img: bool) -> list[Any]:
            controls = accordion(host, is_img2img, getattr(self, "plan_button", None))
            self.infotext_fields = infotext_fields(controls)
            return controls

        def process_batch(self, p: Any, *args: Any, **kwargs: Any) -> None:
            # Right before this batch's prompts are encoded (setup_conds).
            hand_over(p, args, host, TEXT_ENCODER)

        def process_before_every_sampling(self, p: Any, *args: Any, **kwargs: Any) -> None:
            # Called again for the hires pass, on a fresh copy of the UNet's patcher (and of
            # the CLIP's: the hires prompts are encoded after it).
            for site in (DIFFUSION_MODEL, TEXT_ENCODER):
                hand_over(p, args, host, site)

    return FerryOffloadScript
