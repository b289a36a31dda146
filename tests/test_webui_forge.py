"""The Forge host (webui/) against faithful stand-ins of Forge's patcher, LoRA loader and
memory manager (tests/webui_standins.py): what needs no Forge, in CI. tests/forge/ runs the
same contract in a real Forge."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import webui_standins as forge
from tests.conftest import PACK_NAME, load_pack
from tests.helpers import tmpfs

load_pack()
controls = importlib.import_module(f"{PACK_NAME}.webui.controls")
layout_mod = importlib.import_module(f"{PACK_NAME}.webui.live_layout")
patcher_mod = importlib.import_module(f"{PACK_NAME}.webui.patcher")
script_mod = importlib.import_module(f"{PACK_NAME}.webui.script")
site = importlib.import_module(f"{PACK_NAME}.seam.site")
routes = importlib.import_module(f"{PACK_NAME}.webui.routes")
oc = importlib.import_module(f"{PACK_NAME}.offload_core")
settings_file = importlib.import_module(f"{PACK_NAME}.offload_core.tools.settings_file")

X = torch.randn(2, 64, generator=torch.Generator().manual_seed(5))
LORA_KEYS = (
    "diffusion_model.input_blocks.0.to_q.weight",
    "diffusion_model.output_blocks.3.proj.weight",
)


def lora() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(9)
    return {
        k: (torch.randn(64, 4, generator=g) * 0.1, torch.randn(4, 64, generator=g))
        for k in LORA_KEYS
    }


class Script:
    """The "Ferry offload" script as Forge instantiates it (its base: a stand-in Script)."""

    def __init__(self, host: Any) -> None:
        cls = script_mod.script_class(host)
        self.obj = cls()

    def process_before_every_sampling(self, p: Any, *args: Any, **kw: Any) -> None:
        self.obj.process_before_every_sampling(p, *args, **kw)

    def process_batch(self, p: Any, *args: Any, **kw: Any) -> None:
        # Before each batch's prompts are encoded (tests/webui_standins.py encode_batch).
        self.obj.process_batch(p, *args, **kw)


class StandInScriptBase:
    pass


@pytest.fixture
def host(tmp_path: Path) -> Any:
    return script_mod.Host(
        script_base=StandInScriptBase,
        always_visible="AlwaysVisible",
        gr=None,
        input_accordion=None,
        default_disk_path=str(tmp_path / "default-disk"),
        load_saved=lambda: settings_file.load_settings(tmp_path / "settings.json"),
    )


def ferry(tier: str = "ram", level: str = "block", blocks: int = 2, disk: str = "", look: int = 1,
          budget: str = "", use_saved: bool = False, enabled: bool = True,
          text_encoder: bool | None = None) -> tuple[Any, ...]:  # fmt: skip
    """The accordion's values (webui/controls.py CONTROLS); the text-encoder box last where
    ``text_encoder`` is given (None: an API caller that predates it)."""
    box = () if text_encoder is None else (text_encoder,)
    return (enabled, level, blocks, tier, disk, look, budget, use_saved, *box)


#: The tokens the text-encoder sessions encode: two 75-token chunks' worth of the stand-ins.
TOKENS = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(3))


class Session:
    """One Forge process: a memory manager, a loaded checkpoint, the Ferry script; ``network``
    is the one the tests drive through the accordion (the UNet, or the text encoder: then the
    checkpoint's CLIP holds ``encoders`` and the box is ticked)."""

    def __init__(
        self, host: Any, seed: int = 0, load: Any = None, network: str = "unet",
        encoders: tuple[str, ...] = ("clip_l",),
    ) -> None:  # fmt: skip
        self.network = network
        self.site = site.DIFFUSION_MODEL if network == "unet" else site.TEXT_ENCODER
        if load is None and network != "unet":
            load = lambda seed: forge.load_text_checkpoint(seed, encoders)  # noqa: E731
        self.mm = forge.MemoryManager()
        self.sd = (load or forge.load_checkpoint)(seed)
        self.script = Script(host)

    def run(
        self, args: tuple[Any, ...] | None = None, lora_patches: Any = None, online: bool = False
    ) -> tuple[torch.Tensor, Any]:
        scripts = [] if args is None else [(self.script, args)]
        return forge.generate(self.mm, self.sd, scripts, X, lora_patches, online=online)

    def encode(self, args: tuple[Any, ...] | None = None, lora: Any = None) -> tuple[Any, Any]:
        scripts = [] if args is None else [(self.script, args)]
        return forge.encode_batch(self.mm, self.sd, scripts, TOKENS, lora)

    def go(self, args: tuple[Any, ...] | None = None) -> tuple[torch.Tensor, Any]:
        """One run of this session's network: a generation, or a batch's prompts encoded."""
        return self.run(args) if self.network == "unet" else self.encode(args)

    def ferry(self, **kw: Any) -> tuple[Any, ...]:
        """The accordion's values that put this session's network through Ferry."""
        if self.network == "unet":
            return ferry(**kw)
        return ferry(**{"blocks": 1, **kw}, text_encoder=True)

    @property
    def kmodel(self) -> Any:
        return self.sd.forge_objects_original.unet.model

    @property
    def joint(self) -> Any:
        return self.sd.forge_objects_original.clip.cond_stage_model

    @property
    def layout(self) -> Any:
        shared = self.kmodel if self.network == "unet" else self.joint
        return layout_mod.ForgeLayout.of_patcher(shared, self.site)


@pytest.fixture
def session(host: Any) -> Any:
    s = Session(host)
    yield s
    s.layout.release()


@pytest.fixture(params=["unet", "text_encoder"])
def either(host: Any, request: Any) -> Any:
    """A session of each network the accordion offloads: the tests below hold for both."""
    s = Session(host, network=request.param)
    yield s
    s.layout.release()


#: Passes a run makes of each network: one UNet call; the text encoder once per chunk.
PASSES = {"unet": 1, "text_encoder": 2}


@pytest.mark.parametrize("tier", ["ram", "pinned", "shared", "disk"])
@pytest.mark.parametrize("level", ["block", "leaf"])
def test_every_tier_and_level_is_forges_output(
    either: Any, tmp_path: Path, level: str, tier: str
) -> None:
    plain, _ = either.go()
    got, p = either.go(either.ferry(tier=tier, level=level, disk=str(tmp_path / "d")))
    assert torch.equal(got, plain)
    handle = either.layout.handle
    assert (
        handle is not None and handle.policy.tier_name == tier and handle.policy.level_name == level
    )
    assert handle.kind is either.site.kind and handle.stats().kind == either.site.kind.value
    # Each UNet call, each chunk the engine encodes (seam/passes.py), is one pass.
    assert handle.stats().forwards == PASSES[either.network] and handle.stats().group_loads > 0
    assert p.extra_generation_params["Ferry"].split(", ")[1] == tier
    if either.network == "text_encoder":  # its line reads "text encoder: clip_l"
        assert handle.name == "clip_l"
        assert p.extra_generation_params["Ferry"].endswith(", text encoder too")
        assert oc.find_offload(either.kmodel.diffusion_model) is None  # the UNet stays Forge's


def test_unchanged_settings_keep_the_layout_a_change_lays_it_out_again(either: Any) -> None:
    plain, _ = either.go()
    either.go(either.ferry(tier="ram"))
    first = either.layout.handle
    before = layout_mod.COUNTS["layouts"]
    for _ in range(2):
        got, _ = either.go(either.ferry(tier="ram"))
        assert torch.equal(got, plain)
    assert either.layout.handle is first and layout_mod.COUNTS["layouts"] == before
    assert first.stats().forwards == 3 * PASSES[either.network]
    got, _ = either.go(either.ferry(tier="ram", blocks=3))
    assert torch.equal(got, plain) and either.layout.handle is not first and first.removed
    assert layout_mod.COUNTS["layouts"] == before + 1


def test_forge_unloading_the_network_releases_the_layout(either: Any) -> None:
    either.go(either.ferry(tier="ram"))
    handle = either.layout.handle
    either.mm.unload_all_models()  # free_memory(..., free_all=True): unpatch to offload_device
    assert handle.removed and oc.find_offload(either.layout.module) is None


def test_switching_ferry_off_gives_forge_its_plain_network(session: Any) -> None:
    plain, _ = session.run()
    session.run(ferry(tier="ram", level="leaf"))
    dm = session.kmodel.diffusion_model
    assert oc.find_offload(dm) is not None
    got, p = session.run(ferry(enabled=False))
    assert torch.equal(got, plain) and "Ferry" not in p.extra_generation_params
    assert oc.find_offload(dm) is None and not session.layout.live
    assert type(session.sd.forge_objects.unet) is forge.UnetPatcher  # Forge's own patcher


def test_switching_off_gives_back_forges_views_of_the_checkpoint(
    session: Any, tmp_path: Path
) -> None:
    """Forge's Linear weights are views of the mapped checkpoint (page cache, not process
    memory); after Ferry they are those views again, not copies (webui/file_views.py)."""
    dm = session.kmodel.diffusion_model
    names = [n for n, _ in dm.named_parameters() if n.endswith(("to_q.weight", "proj.weight"))]
    params = [dm.get_parameter(n) for n in names]
    raw = tmp_path / "checkpoint.bin"
    raw.write_bytes(b"".join(p.detach().numpy().tobytes() for p in params))
    mapped = torch.from_file(str(raw), shared=False, size=sum(p.numel() for p in params))
    off = 0
    for p in params:
        p.data = mapped[off : off + p.numel()].view(p.shape)
        off += p.numel()
    where = {n: dm.get_parameter(n).data_ptr() for n in names}
    plain, _ = session.run()
    for args in (ferry(tier="ram"), ferry(tier="disk", disk=str(tmp_path / "d"), level="leaf")):
        got, _ = session.run(args)
        assert torch.equal(got, plain)
        grouped = [n for n in names if not n.startswith("middle_block")]  # 1 block: outside
        assert all(dm.get_parameter(n).data_ptr() != where[n] for n in grouped)  # Ferry's now
    got, _ = session.run(ferry(enabled=False))
    assert torch.equal(got, plain)
    assert {n: dm.get_parameter(n).data_ptr() for n in names} == where
    # A LoRA merged before the layout changes those bytes: that weight stays Ferry's copy.
    session.run(ferry(tier="ram"), lora_patches=lora())
    session.layout.release()
    lora_key = LORA_KEYS[0].removeprefix("diffusion_model.")
    assert dm.get_parameter(lora_key).data_ptr() != where[lora_key]


def test_lora_is_merged_as_forge_merges_it(session: Any, tmp_path: Path) -> None:
    plain, _ = session.run()
    plain_lora, _ = session.run(lora_patches=lora())
    assert not torch.equal(plain_lora, plain)
    for args in (ferry(tier="ram"), ferry(tier="disk", disk=str(tmp_path), level="leaf")):
        got, _ = session.run(args, lora_patches=lora())
        assert torch.equal(got, plain_lora), args
    got, _ = session.run(ferry(tier="ram"))  # the LoRA removed, Ferry on
    assert torch.equal(got, plain)
    got, _ = session.run(lora_patches=lora())  # Ferry off: Forge's own merge again
    assert torch.equal(got, plain_lora)
    assert session.run()[0].equal(plain)


def test_forges_cpu_swap_finds_nothing_to_move(session: Any, monkeypatch: Any) -> None:
    """Where VRAM is short Forge moves the loaded module's parts itself; with Ferry the loaded
    module is empty, so the layout is never moved behind the engine's back.

    Forge swaps only for a model loading to a GPU, and CI has none to run the UNet on: the UNet
    is loaded as load_models_gpu loads it on a GPU whose free memory is the inference memory
    and a quarter of the UNet, with the budget Forge computes for that."""
    unet_bytes = forge.module_size(session.kmodel)
    budget = forge.compute_model_gpu_memory_when_using_cpu_swap(
        forge.GIB + unet_bytes // 4, forge.GIB
    )
    assert 0 <= budget < unet_bytes
    mm = session.mm

    def short_of_vram(models: list[Any]) -> None:
        for m in models:
            mm.unload_model_clones(m)
            lm = forge.LoadedModel(m)
            lm.model_load(budget)
            mm.current_loaded_models.insert(0, lm)

    monkeypatch.setattr(mm, "load_models_gpu", short_of_vram)
    plain, _ = session.run()
    assert mm.current_loaded_models[0].moved, "Forge's own patcher: its swap moves the Linears"
    got, _ = session.run(ferry(tier="ram"))
    assert torch.equal(got, plain)
    assert mm.current_loaded_models[0].swap_budget == budget
    assert mm.current_loaded_models[0].moved == []


def test_a_clone_after_ferry_keeps_the_offload(session: Any, host: Any) -> None:
    """Scripts after Ferry's (FreeU, ...) clone the UNet: UnetPatcher.clone builds a plain one."""

    class Cloner:
        def process_before_every_sampling(self, p: Any, *args: Any, **kw: Any) -> None:
            p.sd_model.forge_objects.unet = p.sd_model.forge_objects.unet.clone()

    plain, _ = session.run()
    got, _ = forge.generate(session.mm, session.sd, [(session.script, ferry()), (Cloner(), ())], X)
    assert torch.equal(got, plain)
    unet = session.sd.forge_objects.unet
    assert isinstance(unet, patcher_mod.FerryPatcherMixin) and unet.ferry_offload is not None
    assert session.layout.live


def test_an_abandoned_clone_does_not_pull_the_layout(session: Any) -> None:
    session.run(ferry())
    old = session.sd.forge_objects.unet
    session.run(ferry())
    assert session.layout.live
    old.forge_unpatch_model()  # Forge's free_memory unpatches abandoned patchers like this
    assert session.layout.live
    session.sd.forge_objects.unet.forge_unpatch_model(forge.CPU)  # a full unload releases
    assert not session.layout.live


def test_a_checkpoint_switch_releases_the_old_layout(host: Any, tmp_path: Path) -> None:
    a = Session(host, seed=0)
    a.run(ferry(tier="disk", disk=str(tmp_path)))
    folder = Path(a.layout.handle.stats().disk_folder)
    assert any(folder.iterdir())
    a.mm.unload_all_models()  # what Forge does before loading another checkpoint
    assert not a.layout.live and not folder.exists()
    b = Session(host, seed=1)
    b.mm = a.mm
    plain_b, _ = b.run()
    got, _ = b.run(ferry(tier="disk", disk=str(tmp_path)))
    assert torch.equal(got, plain_b)
    b.layout.release()


def _refusal(session: Any, args: tuple[Any, ...]) -> str:
    with pytest.raises(controls.ControlError) as e:
        session.run(args)
    return str(e.value)


def test_refusals_name_the_control_stop_the_load_and_the_next_generation_works(
    session: Any, tmp_path: Path
) -> None:
    plain, _ = session.run()
    assert _refusal(session, ferry(blocks=9)) == (
        "Ferry offload › Blocks per group: this model has at most 6 blocks in a row; choose 1..6"
    )
    with tmpfs(tmp_path / "ro", "1m", readonly=True) as ro:
        msg = _refusal(session, ferry(tier="disk", disk=str(ro / "f")))
    assert msg.startswith("Ferry offload › Disk folder: ") and "not writable" in msg, msg
    assert _refusal(session, ferry(budget="lots")).startswith(
        "Ferry offload › VRAM budget (GiB): 'lots' is not a budget"
    )
    assert _refusal(session, ferry(look=0)).startswith("Ferry offload › Look-ahead: ")
    assert _refusal(session, ferry(tier="floppy")).startswith(
        "Ferry offload › Where the rest waits: "
    )
    assert not session.layout.live
    got, _ = session.run(ferry(tier="ram"))
    assert torch.equal(got, plain)


def test_use_saved_settings(session: Any, tmp_path: Path) -> None:
    plain, _ = session.run()
    path = tmp_path / "settings.json"
    settings_file.save_settings(
        settings_file.PanelSettings(oc.OffloadPolicy.from_dict({"level": "leaf", "tier": "disk", "prefetch_depth": 2, "disk_path": str(tmp_path / "saved")})),
        path,
    )  # fmt: skip
    got, p = session.run(ferry(tier="ram", use_saved=True))
    assert torch.equal(got, plain)
    assert p.extra_generation_params["Ferry"] == "leaf, disk, look-ahead 2, VRAM budget none"
    assert session.layout.handle.policy.tier.path == str(tmp_path / "saved")
    path.write_text(json.dumps({"ferry_settings": 1, "policy": {"prefetch_depth": 99}}))
    assert _refusal(session, ferry(use_saved=True)).startswith(
        "Ferry offload › Use saved settings: the saved setting 'prefetch_depth' is invalid"
    )


def test_empty_disk_folder_is_the_webuis_default(session: Any, host: Any) -> None:
    session.run(ferry(tier="disk", disk=""))
    assert session.layout.handle.policy.tier.path == host.default_disk_path


def test_the_stats_route_counts_layouts(session: Any) -> None:
    session.run(ferry(tier="ram"))
    s = routes.stats()
    assert [o["tier"] for o in s["offloads"] if o["name"] == "tiny"] == ["ram"]
    assert s["layouts"] >= 1 and "settings_path" in s


# ---- Forge's own low-bit weights (webui/low_bit.py) -----------------------------------------
def gguf_session(host: Any, seed: int = 0) -> Session:
    return Session(host, seed, forge.load_gguf_checkpoint)


def quantized(dm: Any) -> dict[str, Any]:
    return {n: p for n, p in dm.named_parameters() if getattr(p, "gguf_cls", None) is not None}


@pytest.mark.parametrize("tier", ["ram", "pinned", "disk"])
@pytest.mark.parametrize("level", ["block", "leaf"])
def test_gguf_every_tier_and_level_is_forges_output(
    host: Any, tmp_path: Path, level: str, tier: str
) -> None:
    """Ferry first, on a GGUF model Forge never loaded: Forge bakes GGUF weights on the module
    its patcher returns (empty for Ferry's), so Ferry bakes them as Forge would. The quantized
    parameters stay the same objects, class and attributes; the F16 weight and bias that
    Forge's forward replaces by F32 copies are replaced under Ferry too, with the same values."""
    forge_only = gguf_session(host)
    plain, _ = forge_only.run()
    s = gguf_session(host)
    dm = s.kmodel.diffusion_model
    before = quantized(dm)
    assert before and not any(p.baked for p in before.values())
    args = ferry(tier=tier, level=level, disk=str(tmp_path / "d"))
    try:
        for _ in range(2):
            got, _ = s.run(args)
            assert torch.equal(got, plain)
        assert s.layout.live and s.layout.handle.stats().forwards == 2
        now = quantized(dm)
        assert now.keys() == before.keys() and all(now[n] is before[n] for n in now)
        assert all(type(p) is forge.ParameterGGUF and p.baked for p in now.values())
        got, _ = s.run(ferry(enabled=False))
        assert torch.equal(got, plain) and not s.layout.live
    finally:
        s.layout.release()


def test_gguf_lora_is_requantized_as_forge_does(host: Any, tmp_path: Path) -> None:
    """Forge's default LoRA on a GGUF UNet: merged offline and requantized into the same
    parameter (quantize_pytorch), which needs it baked."""
    forge_only = gguf_session(host)
    plain, _ = forge_only.run()
    plain_lora, _ = forge_only.run(lora_patches=lora())
    assert not torch.equal(plain_lora, plain)
    s = gguf_session(host)
    try:
        for args in (ferry(tier="ram"), ferry(tier="disk", disk=str(tmp_path), level="leaf")):
            got, _ = s.run(args, lora_patches=lora())
            assert torch.equal(got, plain_lora), args
            w = s.kmodel.diffusion_model.input_blocks[0].to_q.weight
            assert type(w) is forge.ParameterGGUF and w.baked
        got, _ = s.run(ferry(tier="ram"))
        assert torch.equal(got, plain)
    finally:
        s.layout.release()


def test_online_lora_on_gguf_is_forges_output(host: Any, tmp_path: Path) -> None:
    """Forge's "(fp16 LoRA)" options on a low-bit UNet: the patches go on the layer and are
    merged into the dequantized weight on every forward, which under Ferry is read from
    Ferry's slot."""
    forge_only = gguf_session(host)
    plain, _ = forge_only.run()
    offline, _ = forge_only.run(lora_patches=lora())
    online, _ = forge_only.run(lora_patches=lora(), online=True)
    assert not torch.equal(online, plain) and not torch.equal(online, offline)
    s = gguf_session(host)
    dm = s.kmodel.diffusion_model
    try:
        for args in (
            ferry(tier="pinned"),
            ferry(tier="disk", disk=str(tmp_path), level="leaf"),
            ferry(tier="ram", blocks=3),
        ):
            got, _ = s.run(args, lora_patches=lora(), online=True)
            assert torch.equal(got, online), args
            assert "weight" in dm.input_blocks[0].to_q.forge_online_loras
        got, _ = s.run(ferry(tier="ram"))  # the LoRA removed: its patches leave the layer
        assert torch.equal(got, plain) and not hasattr(
            dm.input_blocks[0].to_q, "forge_online_loras"
        )
        got, _ = s.run(ferry(enabled=False), lora_patches=lora(), online=True)
        assert torch.equal(got, online)
    finally:
        s.layout.release()


def nf4_session(host: Any, seed: int = 0) -> Session:
    return Session(host, seed, forge.load_nf4_checkpoint)


@pytest.mark.parametrize("tier", ["ram", "pinned", "disk"])
def test_nf4_runs_where_its_quant_state_is(host: Any, tmp_path: Path, tier: str) -> None:
    """A bnb NF4 weight's quant_state is separate tensors: Ferry moves the packed bytes only,
    which is Forge's computation where the state already sits on the load device (here the
    CPU, as in a CPU Forge)."""
    plain, _ = nf4_session(host).run()
    s = nf4_session(host)
    w = s.kmodel.diffusion_model.input_blocks[0].to_q.weight
    state = w.quant_state
    try:
        for level in ("block", "leaf"):
            got, _ = s.run(ferry(tier=tier, level=level, disk=str(tmp_path / level)))
            assert torch.equal(got, plain)
            assert s.kmodel.diffusion_model.input_blocks[0].to_q.weight is w
            assert w.quant_state is state and type(w) is forge.Params4bit
    finally:
        s.layout.release()


def _nothing_moved(s: Session, args: tuple[Any, ...], host: Any) -> str:
    """The refusal the script hands Forge (a patcher that refuses to load), and the load
    raising it, with every weight where it was."""
    dm = s.kmodel.diffusion_model
    where = {n: p.data_ptr() for n, p in dm.named_parameters()}
    p = forge.Processing(s.sd)
    msg = script_mod.hand_over(p, args, host, site.DIFFUSION_MODEL)
    with pytest.raises(controls.ControlError) as e:
        p.sd_model.forge_objects.unet.forge_patch_model(forge.CPU)
    assert str(e.value) == msg
    assert not s.layout.live and {n: p.data_ptr() for n, p in dm.named_parameters()} == where
    return msg


def test_nf4_with_its_state_elsewhere_is_refused_before_anything_moves(host: Any) -> None:
    s = nf4_session(host)
    w = s.kmodel.diffusion_model.input_blocks[2].proj.weight
    w.quant_state = forge.copy_quant_state(w.quant_state, torch.device("meta"))
    assert _nothing_moved(s, ferry(tier="ram"), host) == (
        "Ferry offload: this UNet's input_blocks.2.proj.weight is a bitsandbytes NF4 weight "
        "whose quantization state (quant_state.absmax and the rest) sits on meta, apart from "
        "its bytes; Ferry moves a weight's bytes only, so on cpu it would compute with a state "
        "left behind. Turn Ferry offload off for this model (Forge's own loading runs it)"
    )


def test_nf4_forge_has_not_quantized_is_refused(host: Any) -> None:
    s = nf4_session(host)
    s.kmodel.diffusion_model.middle_block[0].to_q.weight.bnb_quantized = False
    assert _nothing_moved(s, ferry(tier="disk", level="leaf"), host).startswith(
        "Ferry offload: this UNet's middle_block.0.to_q.weight is a bitsandbytes NF4 weight "
        "Forge has not quantized yet"
    )


class AliasedParameter(torch.nn.Parameter):
    """A parameter type whose attribute views its own bytes (Ferry would leave it behind)."""


def test_a_tensor_ferry_cannot_move_is_refused_naming_the_control(session: Any, host: Any) -> None:
    lin = session.kmodel.diffusion_model.output_blocks[1].to_q
    p = AliasedParameter(lin.weight.detach().clone(), requires_grad=False)
    p.first_row = p.data[0]
    lin.weight = p
    assert _nothing_moved(session, ferry(tier="ram"), host) == (
        "Ferry offload: this UNet's output_blocks.1.to_q.weight is a AliasedParameter tensor "
        "Ferry cannot move (its attribute 'first_row' is a view of its own data). Turn Ferry "
        "offload off for this model (Forge's own loading runs it)"
    )


# ---- the controls (no model) --------------------------------------------------------------
@pytest.mark.parametrize(
    "policy",
    [
        {"level": "block", "blocks_per_group": 3, "tier": "disk", "disk_path": "/x", "prefetch_depth": 2, "vram_budget_gb": "auto"},
        {"level": "leaf", "tier": "pinned", "vram_budget_gb": "6.5"},
        {"level": "block", "tier": "ram"},
    ],
)  # fmt: skip
def test_infotext_round_trips(policy: dict[str, Any]) -> None:
    p = oc.OffloadPolicy.from_dict(policy)
    text = controls.describe(p)
    back = controls.parse_infotext(text)
    assert back is not None and back["enabled"] is True
    flat = {
        "level": back["level"], "blocks_per_group": back["blocks_per_group"], "tier": back["tier"],
        "disk_path": "/x" if back["tier"] == "disk" else None, "prefetch_depth": back["prefetch_depth"],
        "vram_budget_gb": back["vram_budget"],
    }  # fmt: skip
    assert oc.OffloadPolicy.from_dict(flat) == p
    assert controls.parse_infotext("something else") is None
    assert controls.parse_infotext(None) is None


@pytest.mark.parametrize("unit", ["GiB", "GB"])  # GB: an image saved before the units change
def test_pasting_parameters_sets_the_controls(unit: str) -> None:
    widgets = [object() for _ in controls.CONTROLS]
    fields = dict(script_mod.infotext_fields(widgets))
    params = {"Ferry": f"leaf, disk, look-ahead 3, VRAM budget 2 {unit}"}
    got = {cid: fields[w](params) for w, (cid, _) in zip(widgets, controls.CONTROLS) if w in fields}
    assert got == {"enabled": True, "level": "leaf", "blocks_per_group": 1, "tier": "disk",
                   "prefetch_depth": 3, "vram_budget": "2", "use_saved": False,
                   "text_encoder": False}  # fmt: skip
    off = {cid: fields[w]({}) for w, (cid, _) in zip(widgets, controls.CONTROLS) if w in fields}
    assert off["enabled"] is False and off["tier"] is None  # None: Forge leaves it as it is
    params = {"Ferry": "block 2, ram, look-ahead 1, VRAM budget auto, text encoder too"}
    te = {cid: fields[w](params) for w, (cid, _) in zip(widgets, controls.CONTROLS) if w in fields}
    assert te["text_encoder"] is True and te["blocks_per_group"] == 2


def test_api_callers_args() -> None:
    assert controls.controls_dict([True])["tier"] == "auto"  # missing trailing: defaults
    with pytest.raises(controls.ControlError, match="got 10 values for 9 controls"):
        controls.controls_dict([True] * 10)
    # An API caller that predates the text-encoder box: it is off.
    assert controls.switched_on([True] * 8, "text_encoder") is False
    with pytest.raises(controls.ControlError, match=r"^Ferry offload › Offload the text enc"):
        controls.switched_on([True] * 8 + ["yes"], "text_encoder")
    with pytest.raises(controls.ControlError, match=r"^Ferry offload: must be true or false"):
        controls.offload_from_controls(["yes"], default_disk_path="/t", load_saved=lambda: None)
    assert (
        controls.offload_from_controls([False], default_disk_path="/t", load_saved=lambda: None)
        is None
    )
