"""Which release a host's patcher asks for when it goes: seam/family.py's rule for ComfyUI's
patcher tree ([Note: the last of a family]) and webui/loaded.py's for Forge's checkpoint
switch; and Forge's switch, end to end on the stand-ins, reading nothing back."""

from __future__ import annotations

import gc
import importlib
import sys
import weakref
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

from tests import webui_standins as forge
from tests.conftest import PACK_NAME, load_pack
from tests.test_webui_forge import Session, ferry, host

__all__ = ["host"]  # the Forge stand-in host fixture, shared with test_webui_forge

load_pack()
family = importlib.import_module(f"{PACK_NAME}.seam.family")
loaded = importlib.import_module(f"{PACK_NAME}.webui.loaded")
file_source = importlib.import_module(f"{PACK_NAME}.offload_core.disk.file_source")
give_back = importlib.import_module(f"{PACK_NAME}.offload_core.sources.give_back")


class Patcher:
    """ComfyUI's ModelPatcher as far as the rule sees it: ``clone`` keeps the parent, and a
    collected patcher asks, in its ``__del__``, whether it was the last of its family."""

    verdicts: ClassVar[list[tuple[str, bool]]] = []

    def __init__(self, name: str, parent: Patcher | None = None) -> None:
        self.name, self.parent = name, parent

    def clone(self, name: str) -> Patcher:
        return Patcher(name, self)

    def __del__(self) -> None:
        Patcher.verdicts.append((self.name, family.last_of_family(self)))


@pytest.fixture(autouse=True)
def fresh_verdicts() -> None:
    Patcher.verdicts = []


def test_a_root_patcher_going_is_the_last_of_its_family() -> None:
    cache = {"loader": Patcher("root")}
    del cache["loader"]
    assert Patcher.verdicts == [("root", True)]


def test_a_clone_whose_parent_is_cached_is_not_the_last() -> None:
    cache = {"loader": Patcher("root")}
    cache["ferry"] = cache["loader"].clone("ferry")
    del cache["ferry"]
    assert Patcher.verdicts == [("ferry", False)]  # the loader's output can load it again
    del cache["loader"]
    assert Patcher.verdicts[-1] == ("root", True)


def test_a_chain_dropped_together_is_the_last_of_its_family() -> None:
    # UNETLoader -> LoraLoader -> Ferry: the loader's and the LoRA's outputs dropped first
    # (their nodes ran again), the Ferry clone last: it alone held its ancestors.
    cache = {"loader": Patcher("root")}
    cache["lora"] = cache["loader"].clone("lora")
    cache["ferry"] = cache["lora"].clone("ferry")
    del cache["loader"], cache["lora"]
    assert Patcher.verdicts == []
    del cache["ferry"]
    assert Patcher.verdicts[0] == ("ferry", True)


def test_a_sibling_clone_keeps_the_family() -> None:
    cache = {"loader": Patcher("root")}
    cache["ferry"] = cache["loader"].clone("ferry")
    cache["plain lora"] = cache["loader"].clone("plain lora")
    del cache["loader"]
    del cache["ferry"]
    assert Patcher.verdicts == [("ferry", False)]  # the sibling holds the root
    del cache["plain lora"]


def test_a_weak_reference_is_no_holder() -> None:
    # ComfyUI's LoadedModel holds its patcher (and the parent) weakly.
    cache = {"loader": Patcher("root")}
    cache["ferry"] = cache["loader"].clone("ferry")
    loaded_model = SimpleNamespace(parent=weakref.ref(cache["loader"]))
    del cache["loader"]
    del cache["ferry"]
    assert Patcher.verdicts[0] == ("ferry", True)
    assert loaded_model.parent() is None


def test_a_cycle_collected_together_is_the_last_of_its_family() -> None:
    gc.disable()
    try:
        root = Patcher("root")
        child = root.clone("ferry")
        root.cycle = child  # type: ignore[attr-defined]  # a cycle: only the collector frees it
        del root, child
        assert Patcher.verdicts == []
        gc.collect()
    finally:
        gc.enable()
    assert dict(Patcher.verdicts)["ferry"] is True


# -- Forge: the checkpoint a network belongs to ---------------------------------------------
@pytest.fixture
def forge_modules(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``modules.sd_models`` as Forge has it: one loaded checkpoint (``model_data``)."""
    sd_models = ModuleType("modules.sd_models")
    sd_models.model_data = SimpleNamespace(sd_model=None)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "modules.sd_models", sd_models)
    return sd_models.model_data  # type: ignore[attr-defined]


def test_outside_forge_every_network_is_held() -> None:
    assert "modules.sd_models" not in sys.modules
    assert loaded.checkpoint_holds(object())


def test_forge_holds_the_loaded_checkpoints_unet_and_text_encoder(forge_modules: Any) -> None:
    sd = forge.load_checkpoint(0)
    forge_modules.sd_model = sd
    assert loaded.checkpoint_holds(sd.forge_objects.unet.model)
    assert not loaded.checkpoint_holds(forge.load_checkpoint(1).forge_objects.unet.model)
    forge_modules.sd_model = None  # forge_model_reload, before it unloads every model
    assert not loaded.checkpoint_holds(sd.forge_objects.unet.model)


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_a_checkpoint_switch_discards_the_old_layout_unread(
    tier: str, host: Any, tmp_path: Path, forge_modules: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = Session(host, seed=0)
    forge_modules.sd_model = a.sd
    plain, _ = a.run()
    got, _ = a.run(ferry(tier=tier, disk=str(tmp_path)))
    assert torch.equal(got, plain)
    layout = a.layout
    folder = layout.handle.stats().disk_folder

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a discarded layout was read back")

    with monkeypatch.context() as m:
        m.setattr(give_back, "restore_group", forbidden)
        m.setattr(file_source.FileSource, "host_bytes", forbidden)
        forge_modules.sd_model = None  # what forge_model_reload does first
        a.mm.unload_all_models()  # then this
    assert not layout.live
    assert folder is None or not Path(folder).exists()
    b = Session(host, seed=1)  # the next checkpoint runs as before
    b.mm = a.mm
    forge_modules.sd_model = b.sd
    plain_b, _ = b.run()
    got_b, _ = b.run(ferry(tier=tier, disk=str(tmp_path)))
    assert torch.equal(got_b, plain_b)
    b.mm.unload_all_models()  # its checkpoint is loaded: a full unload gives weights back
    out, _ = b.run()
    assert torch.equal(out, plain_b)
