"""apply -> handle -> remove, and everything around it a user can get wrong."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from offload_core import (
    AlreadyOffloadedError,
    BlockLevel,
    ConfigError,
    DiskTier,
    FerryError,
    GroupingError,
    LeafLevel,
    OffloadPolicy,
    PinnedRamTier,
    RamTier,
    apply_offload,
    find_offload,
    live_offloads,
    plan_offload,
)
from tests.helpers import make_model, reference, snapshot, state_equal

REPO = Path(__file__).resolve().parents[1]


def test_apply_twice_raises_and_remove_is_idempotent():
    model = make_model("fp32")
    handle = apply_offload(model, OffloadPolicy(tier=RamTier()), onload_device="cpu")
    assert find_offload(model) is handle and handle in live_offloads()
    with pytest.raises(AlreadyOffloadedError, match=r"remove\(\)"):
        apply_offload(model, OffloadPolicy(tier=RamTier()), onload_device="cpu")
    handle.remove()
    handle.remove()
    assert find_offload(model) is None and handle not in live_offloads()
    again = apply_offload(model, OffloadPolicy(tier=RamTier()), onload_device="cpu")
    again.remove()


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_forward_that_raises_leaves_model_usable(tmp_path, tier):
    x, ref = reference("fp32")
    model = make_model("fp32")
    t = RamTier() if tier == "ram" else DiskTier(str(tmp_path))
    handle = apply_offload(model, OffloadPolicy(tier=t), onload_device="cpu")
    armed = {"on": False}

    def boom(module, args):
        if armed["on"]:
            raise RuntimeError("user code failed half-way")

    hook = model.single_blocks[3].register_forward_pre_hook(boom)
    with torch.no_grad():
        model(**x)  # the traced forward runs clean
    armed["on"] = True
    with torch.no_grad(), pytest.raises(RuntimeError, match="half-way"):
        model(**x)
    hook.remove()
    with torch.no_grad():
        outs = [model(**x) for _ in range(2)]
    handle.remove()
    assert all(torch.equal(o, ref) for o in outs)


class _PartlyUsed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks[:3]:
            x = b(x)
        return x


def test_modules_that_never_ran_are_reported():
    model = _PartlyUsed().requires_grad_(False)
    x = torch.randn(2, 8)
    ref = model(x)
    handle = apply_offload(model, OffloadPolicy(tier=RamTier()), onload_device="cpu")
    out = model(x)
    st = handle.stats()
    handle.remove()
    assert torch.equal(out, ref)
    assert st.never_ran == ["blocks.3"]


def test_model_without_block_list_suggests_leaf():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(GroupingError, match="level='leaf'") as e:
        apply_offload(model, OffloadPolicy(level=BlockLevel(1)), onload_device="cpu")
    assert e.value.setting == "level"
    handle = apply_offload(
        model, OffloadPolicy(level=LeafLevel(), tier=RamTier()), onload_device="cpu"
    )
    handle.remove()


def test_autograd_on_is_refused_with_advice():
    model = make_model("fp32").requires_grad_(True)
    x, _ = reference("fp32")
    handle = apply_offload(model, OffloadPolicy(tier=RamTier()), onload_device="cpu")
    with pytest.raises(FerryError, match="no_grad"):
        model(**x)
    with torch.no_grad():
        model(**x)
    handle.remove()


def test_budget_keeps_evenly_spaced_groups_resident():
    x, ref = reference("bf16")
    model = make_model("bf16")
    base = plan_offload(model, OffloadPolicy(tier=RamTier()), onload_device="cpu")
    slot = base.slot_bytes
    budget = base.outside_bytes + 2 * slot + 4 * slot + slot // 2  # room for 4 resident groups
    policy = OffloadPolicy(tier=RamTier(), vram_budget=budget)
    plan = plan_offload(model, policy, onload_device="cpu")
    resident = [i for i, g in enumerate(plan.groups) if g.resident]
    assert len(resident) == 4
    assert plan.device_bytes <= budget
    gaps = {b - a for a, b in itertools.pairwise(resident)}
    assert max(gaps) - min(gaps) <= 1, f"resident groups not evenly spaced: {resident}"
    handle = apply_offload(model, policy, onload_device="cpu")
    with torch.no_grad():
        outs = [model(**x) for _ in range(2)]
    handle.remove()
    assert all(torch.equal(o, ref) for o in outs)
    assert "fits the budget" in " ".join(
        plan_offload(model, OffloadPolicy(vram_budget=1 << 40), onload_device="cpu").notes
    )
    with pytest.raises(ConfigError, match="vram_budget") as e:
        plan_offload(model, OffloadPolicy(vram_budget=1024), onload_device="cpu")
    assert e.value.setting == "vram_budget"


def test_plan_describes_before_anything_moves():
    model = make_model("fp32")
    before, _ids, _ = snapshot(model)
    plan = plan_offload(
        model, OffloadPolicy(level=BlockLevel(2), tier=PinnedRamTier()), onload_device="cpu"
    )
    text = plan.describe()
    assert "block level" in text and "prefetch depth 1" in text
    assert plan.max_blocks_per_group == len(model.single_blocks)
    assert plan.as_dict()["bytes_per_tier"]["ram"] > 0
    assert state_equal(before, snapshot(model)[0])


def _checkpoint_model(path: Path) -> nn.Module:
    model = make_model("bf16")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model


def test_disk_tier_reads_straight_from_unchanged_checkpoint(tmp_path):
    x, ref = reference("bf16")
    ckpt = tmp_path / "model.safetensors"
    model = _checkpoint_model(ckpt)
    store = tmp_path / "offload"
    policy = OffloadPolicy(tier=DiskTier(str(store), source_checkpoint=str(ckpt)))
    handle = apply_offload(model, policy, onload_device="cpu")
    written = [p for p in store.rglob("*.safetensors")]
    with torch.no_grad():
        outs = [model(**x) for _ in range(2)]
    st = handle.stats()
    handle.remove()
    assert written == [], "unchanged weights are read from the checkpoint, nothing written"
    assert st.bytes_disk > 0
    assert all(torch.equal(o, ref) for o in outs)
    assert ckpt.exists(), "the user's checkpoint is never deleted"


def test_changed_weights_are_written_not_read_from_checkpoint(tmp_path):
    ckpt = tmp_path / "model.safetensors"
    model = _checkpoint_model(ckpt)
    with torch.no_grad():
        model.double_blocks[0].img_attn.qkv.weight.mul_(2)  # e.g. a merged LoRA
    x = reference("bf16")[0]
    with torch.no_grad():
        ref = model(**x)
    store = tmp_path / "offload"
    handle = apply_offload(
        model,
        OffloadPolicy(tier=DiskTier(str(store), source_checkpoint=str(ckpt))),
        onload_device="cpu",
    )
    written = sorted(p.name for p in store.rglob("group-*.safetensors"))
    with torch.no_grad():
        out = model(**x)
    handle.remove()
    assert written == ["group-00000.safetensors"]
    assert torch.equal(out, ref)


def test_group_files_are_valid_safetensors(tmp_path):
    from safetensors import safe_open

    model = make_model("fp32")
    handle = apply_offload(model, OffloadPolicy(tier=DiskTier(str(tmp_path))), onload_device="cpu")
    files = sorted(tmp_path.rglob("group-*.safetensors"))
    assert len(files) == handle.stats().groups
    sd = model.state_dict()
    with safe_open(str(files[0]), "pt") as f:
        keys = [k for k in f.keys() if not k.startswith("__ferry_pad")]  # noqa: SIM118
        for k in keys:
            assert torch.equal(f.get_tensor(k), sd[k])
        assert f.metadata()["ferry"] == "1"
    handle.remove()


def test_import_is_free_of_side_effects():
    code = textwrap.dedent(
        """
        import sys, threading
        import offload_core, torch
        assert threading.active_count() == 1, threading.enumerate()
        assert not any(m.split('.')[0] in ('comfy', 'gradio', 'server', 'folder_paths') for m in sys.modules)
        assert not torch.cuda.is_initialized()
        print('clean')
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "clean" in out.stdout


def test_torch_compile_runs_hooks_eagerly_without_recompiling():
    """Hooks are excluded from graphs (one graph break per group). With the eager backend the
    arithmetic is unchanged, so the output is exact; a later forward compiles nothing new."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    x, ref = reference("fp32")
    model = make_model("fp32")
    handle = apply_offload(model, OffloadPolicy(tier=RamTier()), onload_device="cpu")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    try:
        with torch.no_grad():
            outs = [compiled(**x) for _ in range(2)]
            frames = counters["stats"]["unique_graphs"]
            outs.append(compiled(**x))
            assert counters["stats"]["unique_graphs"] == frames, "the third forward recompiled"
    finally:
        torch._dynamo.reset()
        handle.remove()
    assert all(torch.equal(o, ref) for o in outs)
    assert handle.stats().group_loads >= 3 * handle.stats().groups
