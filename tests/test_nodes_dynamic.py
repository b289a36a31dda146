"""ComfyUI's dynamic VRAM as Ferry's nodes meet it, against stand-ins (no ComfyUI needed).

Each stand-in does what the cited ComfyUI v0.33.0 function does, as far as Ferry can tell; the
opt-in real-ComfyUI suite (tests/comfyui/test_comfyui_dynamic_vram.py) runs the same paths in
ComfyUI v0.33 itself with a CPU stand-in for comfy-aimdo. What neither can show is aimdo's own
VRAM paging: it runs on NVIDIA/AMD GPUs only.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from tests.conftest import PACK_NAME, load_pack

load_pack()
dynamic = importlib.import_module(f"{PACK_NAME}.nodes.patcher.dynamic")
binding_mod = importlib.import_module(f"{PACK_NAME}.nodes.patcher.live_layout")
config = importlib.import_module(f"{PACK_NAME}.nodes.planning.config")
CheckpointWeights = importlib.import_module(
    f"{PACK_NAME}.offload_core.sources.checkpoint_stream"
).CheckpointWeights


class LazyLinear(nn.Linear):
    """``comfy.ops.disable_weight_init.Linear`` with ``comfy.memory_management.aimdo_enabled``
    (v0.33 comfy/ops.py): ``__init__`` skips nn.Linear's and leaves weight and bias None,
    recording the dtype it was asked for; ``_lazy_load_from_state_dict`` assigns the file's
    tensor later, in the file's dtype."""

    def __init__(self, i: int, o: int, bias: bool = True, device=None, dtype=None) -> None:  # type: ignore[no-untyped-def]
        nn.Module.__init__(self)
        self.in_features, self.out_features = i, o
        self.weight = None  # type: ignore[assignment]
        self.bias = None
        self.comfy_need_lazy_init_bias = bias
        self.weight_comfy_model_dtype = dtype
        self.bias_comfy_model_dtype = dtype


class Net(nn.Module):
    def __init__(self, linear: type[nn.Linear], dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.a = linear(8, 16, dtype=dtype)
        self.norm = nn.LayerNorm(16, dtype=dtype)
        self.b = linear(16, 4, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.norm(self.a(x))))


def test_lazy_layers_get_the_meta_weights_a_plain_build_has(tmp_path: Path) -> None:
    torch.manual_seed(0)
    plain = Net(nn.Linear).requires_grad_(False)
    path = tmp_path / "net.safetensors"
    save_file({k: v.contiguous() for k, v in plain.state_dict().items()}, str(path))
    with torch.device("meta"):
        lazy = Net(LazyLinear)
    # Finding 1: without its weights the network still "opens" its checkpoint (only the meta
    # tensors there are checked) and its Linears would compute with None.
    assert lazy.a.weight is None
    assert dynamic.give_lazy_layers_meta_weights(lazy) == 2
    assert dynamic.give_lazy_layers_meta_weights(lazy) == 0  # idempotent
    shapes = {k: (tuple(v.shape), v.dtype, v.device.type) for k, v in lazy.state_dict().items()}
    want = {k: (tuple(v.shape), v.dtype, "meta") for k, v in plain.state_dict().items()}
    assert shapes == want and lazy.b.bias is None
    CheckpointWeights.open(path, lazy).materialize(lazy, "cpu")
    x = torch.randn(3, 8)
    assert torch.equal(lazy(x), plain(x))


def test_the_dtype_the_model_was_built_for_comes_back() -> None:
    # Finding 4: under aimdo a plain patcher's lazy Linear keeps the file's dtype (fp32 here),
    # not UNETLoader's weight_dtype (fp8); a plain load_state_dict would have cast it.
    torch.manual_seed(0)
    w = torch.randn(16, 8)
    m = LazyLinear(8, 16, dtype=torch.float8_e4m3fn)
    m.weight = nn.Parameter(w.clone(), requires_grad=False)
    m.bias = nn.Parameter(torch.randn(16), requires_grad=False)
    assert dynamic.restore_model_dtypes(m) == 2
    plain = torch.empty(16, 8, dtype=torch.float8_e4m3fn)
    plain.copy_(w)  # what load_state_dict does to a parameter built in fp8
    assert m.weight.dtype == torch.float8_e4m3fn and isinstance(m.weight, nn.Parameter)
    assert torch.equal(m.weight.view(torch.uint8), plain.view(torch.uint8))
    assert dynamic.restore_model_dtypes(m) == 0
    untouched = nn.Linear(8, 16)  # nothing says which dtype: left alone
    assert dynamic.restore_model_dtypes(untouched) == 0 and untouched.weight.dtype == torch.float32


class BaseModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.diffusion_model = Net(nn.Linear)


class Patcher:
    """ModelPatcher (v0.33 comfy/model_patcher.py), the parts the delegate needs: ``clone``
    with ``disable_dynamic`` re-runs the loader (``cached_patcher_init``) unless it is given a
    ``model_override``; ``get_clone_model_override`` returns (model, backups)."""

    loads = 0

    def __init__(self, model: BaseModel, dynamic: bool, loader_ok: bool = True) -> None:
        self.model, self.dynamic, self.loader_ok = model, dynamic, loader_ok
        self.non_dynamic_delegate_model = None

    def is_dynamic(self) -> bool:
        return self.dynamic

    def get_clone_model_override(self) -> tuple[BaseModel, tuple[()]]:
        return self.model, ()

    def clone(self, disable_dynamic: bool = False, model_override=None) -> Patcher:  # type: ignore[no-untyped-def]
        if self.dynamic and disable_dynamic:
            if model_override is None:
                if not self.loader_ok:
                    raise RuntimeError("Cannot create non-dynamic delegate: cached_patcher_init")
                Patcher.loads += 1
                model_override = (BaseModel(), ())
            return Patcher(model_override[0], dynamic=False)
        return Patcher(self.model, self.dynamic, self.loader_ok)

    def get_non_dynamic_delegate(self) -> Patcher:
        # ModelPatcherDynamic.get_non_dynamic_delegate: cached on this patcher instance.
        p = self.clone(disable_dynamic=True, model_override=self.non_dynamic_delegate_model)
        self.non_dynamic_delegate_model = p.get_clone_model_override()
        return p


def test_one_delegate_per_dynamic_model() -> None:
    # Finding 2: a Ferry node that runs again, or runs on another clone of the same dynamic
    # model (a LoRA before it), gets the same plain BaseModel: the file is read once.
    Patcher.loads = 0
    loaded = Patcher(BaseModel(), dynamic=True)
    plain = Patcher(BaseModel(), dynamic=False)
    assert dynamic.plain_patcher(plain) == (plain, None)
    firsts = [dynamic.plain_patcher(p)[0] for p in (loaded, loaded, loaded.clone(), loaded.clone())]
    assert Patcher.loads == 1
    assert all(not p.is_dynamic() and p.model is firsts[0].model for p in firsts)
    assert firsts[0].model is not loaded.model


def test_a_dynamic_clips_delegate_is_its_own_network_with_its_dtypes_back() -> None:
    # A CLIP's patcher holds the text encoder itself (no diffusion_model): under dynamic VRAM
    # its delegate's encoder gets back the dtypes it was built for, as a MODEL's network does.
    encoder = Net(LazyLinear, dtype=torch.float16)
    encoder.a.weight = nn.Parameter(torch.randn(16, 8), requires_grad=False)  # the file's fp32
    clip_patcher = Patcher(BaseModel(), dynamic=True)
    clip_patcher.non_dynamic_delegate_model = (encoder, ())  # type: ignore[assignment]
    src, why = dynamic.plain_patcher(clip_patcher)
    assert why is None and src is not None and src.model is encoder and not src.is_dynamic()
    assert encoder.a.weight.dtype == torch.float16


def test_no_delegate_says_what_to_switch_once(caplog: pytest.LogCaptureFixture) -> None:
    src, why = dynamic.plain_patcher(Patcher(BaseModel(), dynamic=True, loader_ok=False))
    assert src is None and "cached_patcher_init" in str(why)
    text = dynamic.DYNAMIC_VRAM_HELP.format(why=why)
    assert "--disable-dynamic-vram" in text and "Traceback" not in text
    with caplog.at_level(logging.WARNING, logger="ferry"):
        said = [dynamic.say_once("test-dynamic", text) for _ in range(3)]
    assert said == [True, False, False]
    assert [r.getMessage().count("--disable-dynamic-vram") for r in caplog.records] == [1]


class OlderDynamicPatcher:
    """A dynamic patcher of a core before the cached delegate: v0.15-era cores have
    ``clone(disable_dynamic=True)`` only; the first dynamic-VRAM cores (0.12) not even that."""

    def __init__(self, delegate: object) -> None:
        self.delegate = delegate
        self.model = BaseModel()

    def is_dynamic(self) -> bool:
        return True

    def clone(self, disable_dynamic: bool = False) -> object:
        if isinstance(self.delegate, Exception):
            raise self.delegate
        return self.delegate if disable_dynamic else self


def test_older_dynamic_cores_get_a_delegate_or_say_what_to_switch() -> None:
    plain = Patcher(BaseModel(), dynamic=False)
    assert dynamic.plain_patcher(OlderDynamicPatcher(plain)) == (plain, None)
    for failure in (
        RuntimeError("Cannot create non-dynamic delegate"),
        TypeError("clone() got an unexpected keyword argument 'disable_dynamic'"),
    ):
        src, why = dynamic.plain_patcher(OlderDynamicPatcher(failure))
        assert src is None and str(failure) in str(why)
    # A "delegate" that is dynamic still: Ferry must not drive it either.
    still = OlderDynamicPatcher(None)
    assert dynamic.plain_patcher(OlderDynamicPatcher(still)) == (None, "")


def _cfg(tier: str = "ram", vram_budget: str = "auto") -> object:
    policy = config.policy_from_inputs(
        level="block", blocks_per_group=1, tier=tier, disk_path="", prefetch_depth=1,
        vram_budget=vram_budget, headroom_gb=0.0,
    )  # fmt: skip
    return config.ComfyOffload(policy, name="net")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(6)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def test_auto_budget_counts_what_the_host_counts_free() -> None:
    # Finding 6: ComfyUI v0.33 counts as free what torch reports plus the VRAM its dynamic
    # loader could evict (ModelPatcher.get_free_memory adds comfy_aimdo's vbars_analyze);
    # torch.cuda.mem_get_info misses the second part. "auto" takes the host's count.
    owner = BaseModel()
    owner.diffusion_model = Blocks().requires_grad_(False)  # type: ignore[assignment]
    b = binding_mod.ComfyLayout.of(owner, owner.diffusion_model)
    group = 64 * 64 * 4 + 64 * 4
    asked: list[torch.device] = []

    def free(device: torch.device) -> int:
        asked.append(device)
        return 100

    b.free_vram = free
    plan = b.plan(_cfg(), "cpu")
    assert asked == [torch.device("cpu")]
    # The model's own bytes already on the device count as free (they move off): the budget
    # holds the 2 streaming slots and some resident groups.
    assert plan.budget_bytes == 6 * group + 100
    assert 1 <= sum(g.resident for g in plan.groups) < 6
    assert plan.device_bytes <= plan.budget_bytes
    # Where the host counts nothing (a CPU in ComfyUI), offload_core's own rule: no budget.
    b2 = binding_mod.ComfyLayout.of(BaseModel(), Blocks())
    b2.free_vram = lambda device: None
    unbudgeted = b2.plan(_cfg(), "cpu")
    assert unbudgeted.budget_bytes is None and not any(g.resident for g in unbudgeted.groups)
    fixed = binding_mod.resolve_auto(_cfg(vram_budget="1").policy, 5, 0)
    assert fixed.vram_budget == 1 << 30  # a number of GB is left as it is


def test_pinned_bytes_are_counted_and_given_back() -> None:
    # Finding 6: ComfyUI's pinned budget (comfy.model_management.TOTAL_PINNED_MEMORY against
    # MAX_PINNED_MEMORY, ensure_pin_registerable) is told every change of Ferry's pinned bytes.
    owner = BaseModel()
    owner.diffusion_model = Blocks().requires_grad_(False)  # type: ignore[assignment]
    b = binding_mod.ComfyLayout.of(owner, owner.diffusion_model)
    told: list[int] = []
    b.count_pinned = told.append
    # On a CPU nothing is pinned (the pinned tier is plain RAM there): nothing is counted.
    b.ensure(_cfg("pinned", ""), "cpu", None, lambda: None)
    assert told == [] and b.handle.plan.bytes_per_tier()["pinned"] == 0
    b._set_pinned(300)  # what a GPU layout reports as bytes_per_tier()["pinned"]
    b._set_pinned(120)
    b.release()
    assert told == [300, -180, -120] and sum(told) == 0
