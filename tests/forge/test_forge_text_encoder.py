"""Real Forge, real API: "Offload the text encoder too" gives Forge's conditioning and image.

One Forge with Ferry (the suite's session server). The reference for each case is the same
server with the accordion's text-encoder box off (the UNet through Ferry with the same
settings, which test_forge_images.py shows is Forge's image): so each comparison isolates the
text encoder. Forge caches the last prompt's conditioning (processing.py
``get_conds_with_caching``: one entry, keyed by the prompt and the model): a case whose prompt
is the one before it would not encode at all. So every generation here has another prompt
than the one before it, and each case checks from ``/ferry/stats`` that the text encoder ran
through Ferry. The conditioning (the test extension's copy of ``p.c``) is compared byte for
byte, and so are the image and the latents.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from forge_client import PROMPT, Image, ferry
from forge_server import Server

CASES = [(tier, level) for tier in ("ram", "pinned", "disk") for level in ("block", "leaf")]
TE_NAME = "clip_l"  # the encoders Forge's SD 1.5 CLIP holds: the line reads "text encoder: clip_l"


def prompt(i: int) -> str:
    return f"{PROMPT}, case {i}"


def text_encoder(srv: Server) -> dict[str, Any] | None:
    offloads = srv.forge.stats()["offloads"]
    found = [o for o in offloads if o["name"] == TE_NAME and o.get("kind") == "text_encoder"]
    assert len(found) <= 1, found
    return found[0] if found else None


def args(tier: str, level: str, disk: Path, te: bool) -> list[Any]:
    return ferry(tier=tier, level=level, disk=str(disk) if tier == "disk" else "", text_encoder=te)


@pytest.fixture(scope="module")
def references(server: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Image]:
    """Each case's image with the text-encoder box off (the same UNet settings)."""
    disk = tmp_path_factory.mktemp("te-ref")
    return {
        i: server.forge.txt2img(args(tier, level, disk, te=False), prompt=prompt(i))
        for i, (tier, level) in enumerate(CASES)
    }


def test_references_depend_on_the_prompt(references: dict[int, Image]) -> None:
    """The comparisons below mean something: each prompt's conditioning is its own."""
    assert len({r.cond for r in references.values()}) == len(CASES)
    assert all(len(r.cond) == 77 * 768 * 4 for r in references.values())  # SD 1.5, float32
    assert all("text encoder" not in r.infotext for r in references.values())


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{t}-{lv}" for t, lv in CASES])
def test_every_tier_and_level_gives_forges_conditioning(
    server: Server, references: dict[int, Image], case: int, tmp_path: Path
) -> None:
    tier, level = CASES[case]
    before = text_encoder(server)
    img = server.forge.txt2img(args(tier, level, tmp_path, te=True), prompt=prompt(case))
    ref = references[case]
    assert img.cond == ref.cond, "the conditioning differs from Forge's"
    assert img.same_as(ref)
    assert img.infotext.count(", text encoder too") == 1, img.infotext
    o = text_encoder(server)
    assert o is not None and (o["level"], o["tier"]) == (level, tier), server.forge.stats()
    assert o["forwards"] >= 1 and o["group_loads"] > 0
    if before is not None and (before["level"], before["tier"]) == (level, tier):
        assert o["forwards"] > before["forwards"]


def test_unchanged_settings_keep_the_text_encoders_layout(
    server: Server, references: dict[int, Image]
) -> None:
    on = ferry(tier="ram", text_encoder=True)
    assert server.forge.txt2img(on, prompt=prompt(100)).infotext  # laid out (or kept)
    laid = server.forge.stats()["layouts"]
    first = text_encoder(server)
    assert first is not None
    for i in (101, 102):
        server.forge.txt2img(on, prompt=prompt(i))
    o = text_encoder(server)
    assert server.forge.stats()["layouts"] == laid, "the same settings must not lay it out again"
    assert o is not None and o["forwards"] == first["forwards"] + 2


def test_box_off_releases_the_text_encoder(server: Server, references: dict[int, Image]) -> None:
    server.forge.txt2img(ferry(tier="ram", text_encoder=True), prompt=prompt(200))
    assert text_encoder(server) is not None
    released = server.forge.stats()["releases"]
    img = server.forge.txt2img(ferry(tier="ram"), prompt=prompt(0))
    assert text_encoder(server) is None and server.forge.stats()["releases"] == released + 1
    ref = references[CASES.index(("ram", "block"))]
    assert img.cond == ref.cond and img.same_as(ref)
    server.forge.txt2img(prompt=prompt(201))  # Ferry off: nothing of it left for later tests
    assert server.forge.stats()["offloads"] == []
