"""The node side of recovery (issue 12), without ComfyUI: a damaged file with no source of
truth becomes a reload of the model, and "already has a Ferry offload" never reaches a node."""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from tests.conftest import PACK_NAME, load_pack
from tests.helpers import fail_first_read_with_eio
from tests.test_nodes_binding import Owner, X, cfg

load_pack()
binding_mod = importlib.import_module(f"{PACK_NAME}.nodes.patcher.live_layout")
recovery = importlib.import_module(f"{PACK_NAME}.nodes.patcher.recovery")
oc = importlib.import_module(f"{PACK_NAME}.offload_core")
pack_files = importlib.import_module(f"{PACK_NAME}.offload_core.disk.files")  # the pack's own
ComfyLayout = binding_mod.ComfyLayout


class Executor:
    """Stands in for ComfyUI's WrapperExecutor around BaseModel.apply_model."""

    def __init__(self, owner: Owner) -> None:
        self.class_obj = owner

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.class_obj.diffusion_model(x)


class Queue:
    def __init__(self) -> None:
        self.flags: dict[str, object] = {}

    def set_flag(self, name: str, value: object) -> None:
        self.flags[name] = value


@pytest.fixture
def comfy_server(monkeypatch: pytest.MonkeyPatch) -> Queue:
    """ComfyUI's ``server`` module as far as recovery reads it."""
    queue = Queue()
    mod = types.ModuleType("server")
    mod.PromptServer = types.SimpleNamespace(  # type: ignore[attr-defined]
        instance=types.SimpleNamespace(prompt_queue=queue)
    )
    monkeypatch.setitem(sys.modules, "server", mod)
    return queue


def _laid_out(tmp_path: Path) -> tuple[Owner, object, torch.Tensor, list[Path]]:
    owner = Owner()
    with torch.no_grad():
        ref = owner.diffusion_model(X)
    b = ComfyLayout.of(owner, owner.diffusion_model)
    b.ensure(cfg("disk", disk_path=str(tmp_path)), "cpu", None, lambda: None)
    assert torch.equal(recovery.guard(Executor(owner), X), ref)
    return owner, b, ref, sorted(tmp_path.rglob("group-*.safetensors"))


@pytest.mark.parametrize("in_comfyui", [True, False])
def test_a_damaged_file_without_source_drops_the_layout_and_reloads(
    tmp_path: Path, request: pytest.FixtureRequest, in_comfyui: bool
) -> None:
    queue = request.getfixturevalue("comfy_server") if in_comfyui else None
    owner, b, ref, files = _laid_out(tmp_path)
    os.truncate(files[1], files[1].stat().st_size - 10)
    with pytest.raises(recovery.ModelReloadError) as e:
        recovery.guard(Executor(owner), X)
    msg = str(e.value)
    assert files[1].name in msg and str(files[1].parent) in msg, msg
    assert "handle" not in msg and "remove()" not in msg and "apply it again" not in msg
    if queue is not None:
        assert queue.flags == {"free_memory": True}
        assert "ComfyUI loads the model again from its file before the next prompt" in msg
    else:
        assert msg.endswith("load the model again.")
    assert not b.live and oc.find_offload(owner.diffusion_model) is None
    assert oc.live_offloads() == [] and not any(tmp_path.iterdir())
    # ComfyUI loads the model again (a new BaseModel): a changed widget lays it out, equal.
    fresh = Owner()
    b2 = ComfyLayout.of(fresh, fresh.diffusion_model)
    b2.ensure(cfg("disk", disk_path=str(tmp_path), prefetch_depth=2), "cpu", None, lambda: None)
    assert torch.equal(recovery.guard(Executor(fresh), X), ref)
    b2.release()


def test_a_changed_widget_while_laid_out_never_says_already_offloaded(tmp_path: Path) -> None:
    owner, b, ref, _ = _laid_out(tmp_path)
    changed = cfg("disk", disk_path=str(tmp_path), prefetch_depth=2)
    plan = b.plan(changed, "cpu")  # the node checks its config against the model
    assert plan.policy == changed.policy and not b.live
    b.ensure(changed, "cpu", None, lambda: None)
    assert torch.equal(recovery.guard(Executor(owner), X), ref)
    b.release()


def test_a_layout_the_binding_lost_track_of_is_let_go(tmp_path: Path) -> None:
    owner = Owner()
    with torch.no_grad():
        ref = owner.diffusion_model(X)
    stray = oc.apply_offload(owner.diffusion_model, cfg().policy, onload_device="cpu")
    b = ComfyLayout.of(owner, owner.diffusion_model)
    b.plan(cfg("pinned"), "cpu")
    assert stray.removed
    stray2 = oc.apply_offload(owner.diffusion_model, cfg().policy, onload_device="cpu")
    b.ensure(cfg("pinned"), "cpu", None, lambda: None)  # planned already: ensure lets go
    assert stray2.removed and b.live
    assert torch.equal(recovery.guard(Executor(owner), X), ref)
    b.release()
    assert oc.live_offloads() == []


@pytest.mark.parametrize("next_prompt", ["changed-widget", "ferry-bypassed"])
def test_the_prompt_right_after_the_damage_reloads_whatever_the_graph(
    tmp_path: Path, comfy_server: Queue, next_prompt: str
) -> None:
    """No forward met the damage yet: the next prompt's changed widget (the node plans again)
    or a plain patcher (ComfyUI detaches the Ferry one: release) finds it on letting go."""
    _, b, _, files = _laid_out(tmp_path)
    os.truncate(files[0], files[0].stat().st_size - 10)
    with pytest.raises(recovery.ModelReloadError, match=files[0].name) as e:
        if next_prompt == "changed-widget":
            b.plan(cfg("disk", disk_path=str(tmp_path), prefetch_depth=2), "cpu")
        else:
            b.release()
    assert "ComfyUI loads the model again" in str(e.value)
    assert comfy_server.flags == {"free_memory": True}
    assert not b.live and oc.live_offloads() == [] and not any(tmp_path.iterdir())
    b.release()  # nothing left to let go: no error
    # ComfyUI can still move and unload the module (a meta tensor's .to() would raise in its
    # prompt worker), and a plain forward of it (the Ferry node bypassed) says what happened.
    assert not any(t.device.type == "meta" for t in b.module.parameters())
    b.module.to("cpu")
    with torch.no_grad(), pytest.raises(recovery.ModelReloadError, match=files[0].name):
        b.module(X)


def test_a_failed_read_is_a_clear_error_and_the_next_prompt_reads_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, b, ref, _ = _laid_out(tmp_path)
    b.release()  # the copy path reads with the platform's reads (the mapped one faults pages in)
    b.ensure(cfg("disk", disk_path=str(tmp_path), cpu_read="copy"), "cpu", None, lambda: None)
    failed = fail_first_read_with_eio(pack_files.files(), monkeypatch)
    with pytest.raises(recovery.ModelReloadError) as e:
        recovery.guard(Executor(owner), X)
    assert "Input/output error" in str(e.value) and str(tmp_path) in str(e.value)
    assert failed and b.live
    assert torch.equal(recovery.guard(Executor(owner), X), ref)
    b.release()


def test_the_panels_apply_after_the_damage_says_what_comfyui_does(
    tmp_path: Path, comfy_server: Queue
) -> None:
    _, b, _, files = _laid_out(tmp_path)
    os.truncate(files[0], files[0].stat().st_size - 10)
    said = binding_mod.release_from_panel(b.handle, None)
    assert files[0].name in said and "ComfyUI loads the model again" in said
    assert not b.live and comfy_server.flags == {"free_memory": True}
