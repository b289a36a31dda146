"""Real Forge, real API: Ferry's images are Forge's images, byte for byte.

The references come from a Forge started WITHOUT this extension (``plain``); then one Forge
with it generates every case. Every image is 64x64, 2 steps, a fixed seed; ``same_as`` compares
the PNG bytes (no text chunk) and the latents the sampler returned, byte for byte. The cases run in order on one server, as a user would click through them.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from forge_client import CKPT_A, CKPT_B, LORA_PROMPT, GenerationError, Image, ferry
from forge_server import Server, start_forge, stop_forge

from tests.helpers import tmpfs

TIERS = ("ram", "pinned", "disk")
LEVELS = ("block", "leaf")


@pytest.fixture(scope="session")
def plain(models: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Image]:
    """Forge without Ferry (no extension installed): A, A with the LoRA, B. Stopped before
    the Ferry server starts, so the two never hold a checkpoint in RAM at once."""
    srv = start_forge(tmp_path_factory.mktemp("forge-plain"), models, with_ferry=False)
    try:
        forge = srv.forge
        images = {
            "A": forge.txt2img(),
            "A seed 2": forge.txt2img(seed=2),
            "A+LoRA": forge.txt2img(prompt=LORA_PROMPT),
            "B": forge.txt2img(ckpt=CKPT_B),
        }
        forge.txt2img()  # img2img's global random state: see test_img2img_gives_forges_image
        images["A img2img"] = forge.img2img(init=images["A"].png)
        return images
    finally:
        stop_forge(srv)


@pytest.fixture(scope="module")
def forge(plain: dict[str, Image], server: Server) -> Server:
    return server


def offloads(srv: Server) -> list[dict[str, Any]]:
    return list(srv.forge.stats()["offloads"])


def test_references_depend_on_the_unet(plain: dict[str, Image]) -> None:
    """The checks below mean something: the images are not flat, and the seed, the LoRA and
    the checkpoint each change them."""
    a = plain["A"]
    colours = {a.pixels().tobytes()[i : i + 3] for i in range(0, 64 * 64 * 3, 3)}
    assert len(colours) > 100, "a flat or saturated image would hide errors"
    digests = {k: v.digest for k, v in plain.items()}
    assert len(set(digests.values())) == len(digests), digests
    assert len({v.latents for v in plain.values()}) == len(plain)
    assert len(a.latents) == 4 * 8 * 8 * 4  # float32 latents of a 64x64 image
    assert "Ferry" not in a.infotext


def test_ferry_off_in_a_forge_with_ferry_is_forge(forge: Server, plain: dict[str, Image]) -> None:
    """Ferry installed but off (no args, and the accordion's off value): Forge's image, and
    nothing laid out. Counted from here: the browser tests may have generated with Ferry
    on in this server before (a layout they left is released by the first generation)."""
    layouts = forge.forge.stats()["layouts"]
    assert forge.forge.txt2img().same_as(plain["A"])
    assert forge.forge.txt2img(ferry(enabled=False)).same_as(plain["A"])
    assert offloads(forge) == [] and forge.forge.stats()["layouts"] == layouts


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("level", LEVELS)
def test_every_tier_and_level_gives_forges_image(
    forge: Server, plain: dict[str, Image], level: str, tier: str, tmp_path: Path
) -> None:
    """Each case changes a setting from the one before: the UNet is laid out again."""
    before = forge.forge.stats()["layouts"]
    disk = str(tmp_path / "ferry") if tier == "disk" else ""
    img = forge.forge.txt2img(ferry(tier=tier, level=level, blocks=2, disk=disk))
    assert img.same_as(plain["A"])
    assert (
        f'Ferry: "{level}{" 2" if level == "block" else ""}, {tier}, look-ahead 1' in img.infotext
    )
    (o,) = offloads(forge)
    assert (o["level"], o["tier"], o["forwards"]) == (level, tier, 2)
    assert o["group_loads"] > 0
    assert forge.forge.stats()["layouts"] == before + 1


def test_img2img_gives_forges_image(forge: Server, plain: dict[str, Image], tmp_path: Path) -> None:
    """The accordion is in img2img too: A's image redrawn, with Ferry on, is Forge's.

    Forge's img2img encodes the init image by sampling the VAE's posterior from torch's global
    generator, which it does not seed there: it is where the last generation's noise left it
    (rng.randn seeds it with the seed + 100000). So each server makes the same txt2img first:
    in plain Forge, this img2img after a seed-1 generation is the same every time, and
    different after a seed-2 one."""
    args = ferry(tier="disk", disk=str(tmp_path), level="leaf")
    assert forge.forge.txt2img(args).same_as(plain["A"])
    img = forge.forge.img2img(args, init=plain["A"].png)
    assert img.same_as(plain["A img2img"])
    assert 'Ferry: "leaf, disk, look-ahead 1' in img.infotext, img.infotext
    (o,) = offloads(forge)
    assert (o["level"], o["tier"]) == ("leaf", "disk") and o["forwards"] > 0


def test_unchanged_settings_keep_the_layout(forge: Server, plain: dict[str, Image]) -> None:
    args = ferry(tier="ram", blocks=3, look_ahead=2)
    assert forge.forge.txt2img(args).same_as(plain["A"])
    laid = forge.forge.stats()["layouts"]
    for seed in (2, 1):
        img = forge.forge.txt2img(args, seed=seed)
        assert img.same_as(plain["A seed 2" if seed == 2 else "A"])
    assert forge.forge.stats()["layouts"] == laid, "the same settings must not lay it out again"
    (o,) = offloads(forge)
    assert o["forwards"] == 6


def test_a_vram_budget_keeps_groups_resident(forge: Server, plain: dict[str, Image]) -> None:
    img = forge.forge.txt2img(ferry(tier="ram", budget="1.5"))
    assert img.same_as(plain["A"]) and "VRAM budget 1.5 GiB" in img.infotext
    (o,) = offloads(forge)
    assert 0 < o["resident_groups"] < o["groups"]


def test_the_disk_tier_reads_the_checkpoint_itself(
    forge: Server, plain: dict[str, Image], tmp_path: Path
) -> None:
    """Checkpoint A is float32, as a CPU Forge keeps its UNet: every group is read from the
    file, so Ferry writes nothing; its RAM copy of the UNet is freed."""
    img = forge.forge.txt2img(ferry(tier="disk", disk=str(tmp_path), blocks=1))
    assert img.same_as(plain["A"])
    (o,) = offloads(forge)
    assert o["bytes_per_tier"]["disk"] > 2.5 * (1 << 30) and o["bytes_disk"] > 0
    assert not list(tmp_path.rglob("*.safetensors")), "groups from the checkpoint write no file"


def test_lora_through_ferry_is_forges_lora(
    forge: Server, plain: dict[str, Image], tmp_path: Path
) -> None:
    for args in (ferry(tier="ram"), ferry(tier="disk", disk=str(tmp_path), level="leaf")):
        img = forge.forge.txt2img(args, prompt=LORA_PROMPT)
        assert img.same_as(plain["A+LoRA"]), args
    # The LoRA changed every attention projection: those groups are no longer the file's.
    assert list(tmp_path.rglob("*.safetensors"))
    # LoRA removed, Ferry still on: the original weights come back.
    assert forge.forge.txt2img(ferry(tier="ram")).same_as(plain["A"])
    # LoRA with Ferry switched off: Forge's own merge of it.
    assert forge.forge.txt2img(prompt=LORA_PROMPT).same_as(plain["A+LoRA"])


def test_switching_ferry_off_gives_forge_its_path_back(
    forge: Server, plain: dict[str, Image]
) -> None:
    forge.forge.txt2img(ferry(tier="ram", level="leaf"))
    assert offloads(forge)
    released = forge.forge.stats()["releases"]
    img = forge.forge.txt2img(ferry(enabled=False))
    assert img.same_as(plain["A"]) and "Ferry" not in img.infotext
    assert offloads(forge) == [] and forge.forge.stats()["releases"] == released + 1


def test_a_second_checkpoint(forge: Server, plain: dict[str, Image], tmp_path: Path) -> None:
    """Switching checkpoints with Ferry on: A's layout is discarded, nothing read back (its
    folder removed: issue 42) and B is laid out; B is float16, cast to float32 by Forge, so
    its groups are written."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    assert forge.forge.txt2img(ferry(tier="disk", disk=str(a_dir))).same_as(plain["A"])
    log_at = len(forge.log.read_text(errors="replace"))
    img = forge.forge.txt2img(ferry(tier="disk", disk=str(b_dir)), ckpt=CKPT_B)
    switched = forge.log.read_text(errors="replace")[log_at:]
    assert "Ferry: discarded (nothing read back) ferry-sd15-a" in switched, switched[-3000:]
    assert img.same_as(plain["B"])
    (o,) = offloads(forge)
    assert o["name"] == "ferry-sd15-b"
    assert not any(a_dir.rglob("*.safetensors")), "A's layout must be gone with A"
    assert len(list(b_dir.rglob("group-*.safetensors"))) == o["groups"] - o["resident_groups"]
    assert forge.forge.txt2img(ckpt=CKPT_B).same_as(plain["B"])  # and off again
    assert forge.forge.txt2img(ferry(tier="ram"), ckpt=CKPT_A).same_as(plain["A"])


def _refused(forge: Server, args: list[Any]) -> str:
    with pytest.raises(GenerationError) as e:
        forge.forge.txt2img(args)
    return e.value.message


def test_refusals_name_the_control_and_the_next_generation_works(
    forge: Server, plain: dict[str, Image], tmp_path: Path
) -> None:
    msg = _refused(forge, ferry(tier="ram", blocks=20))
    assert msg.startswith("Ferry offload › Blocks per group: this model has at most 12"), msg
    with tmpfs(tmp_path / "ro", "1m", readonly=True) as ro:
        msg = _refused(forge, ferry(tier="disk", disk=str(ro / "ferry")))
    assert msg.startswith("Ferry offload › Disk folder: ") and "not writable" in msg, msg
    msg = _refused(forge, ferry(tier="ram", budget="lots"))
    assert msg.startswith("Ferry offload › VRAM budget (GiB): 'lots' is not a budget"), msg
    assert forge.forge.stats()["refusals"] >= 3
    assert offloads(forge) == []  # refused before anything was laid out
    img = forge.forge.txt2img(ferry(tier="disk", disk=str(tmp_path / "ok")))
    assert img.same_as(plain["A"])


@pytest.fixture
def saved(forge: Server) -> Iterator[Path]:
    yield forge.settings
    forge.settings.unlink(missing_ok=True)


def test_use_saved_settings_reads_the_settings_file(
    forge: Server, plain: dict[str, Image], saved: Path, tmp_path: Path
) -> None:
    """The file the Ferry tab's Save writes (and ComfyUI's nodes read); here written by hand,
    the browser test saves it through the tab."""
    saved.write_text(
        '{"ferry_settings": 1, "quant_preset": "none", "policy": {"level": "leaf", "tier": '
        f'"disk", "disk_path": "{tmp_path}", "prefetch_depth": 2}}}}\n'
    )
    img = forge.forge.txt2img(ferry(tier="ram", use_saved=True))
    assert img.same_as(plain["A"])
    assert 'Ferry: "leaf, disk, look-ahead 2, VRAM budget none"' in img.infotext
    (o,) = offloads(forge)
    assert (o["level"], o["tier"], o["prefetch_depth"]) == ("leaf", "disk", 2)
    saved.write_text('{"ferry_settings": 1, "policy": {"tier": "floppy"}}')
    msg = _refused(forge, ferry(use_saved=True))
    assert msg.startswith("Ferry offload › Use saved settings: the saved setting 'tier'"), msg
    shutil.rmtree(tmp_path, ignore_errors=True)
