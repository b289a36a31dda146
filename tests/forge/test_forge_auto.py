"""Real Forge: the accordion on ``auto`` (tier, blocks per group, look-ahead chosen by the
planner, webui/auto_plan.py) gives the image its forced choice gives and Forge's own image,
byte for byte; ``GET /ferry/plan`` answers the same choice; the plan counts the Steps and CFG
the generation runs.

Forge's own image is the accordion off in the suite's server: Forge's path untouched, which
test_forge_images.py checks is a Forge without this extension's image, byte for byte (one
server here: a second Forge would double this module's RAM and time).
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

import pytest
from forge_client import PROMPT, Image, ferry
from forge_server import Server

AUTO = {"tier": "auto", "blocks": "auto", "look_ahead": "auto"}
SAID = re.compile(r'Ferry: "block (\d+), (pinned|ram|disk), look-ahead (\d+), VRAM budget')


@pytest.fixture(scope="module")
def own(server: Server) -> Image:
    """Forge's own image (the accordion off), with the checkpoint loaded."""
    image = server.forge.txt2img(ferry(enabled=False))
    assert "Ferry" not in image.infotext
    return image


def plan(srv: Server, **query: Any) -> dict[str, Any]:
    q = {k: str(v).lower() if isinstance(v, bool) else v for k, v in query.items()}
    return dict(srv.forge.get("/ferry/plan?" + urllib.parse.urlencode(q)))


def chosen(image: Image) -> tuple[int, str, int]:
    """(blocks per group, tier, look-ahead) the image's parameters say ran."""
    m = SAID.search(image.infotext)
    assert m is not None, image.infotext
    return int(m[1]), m[2], int(m[3])


def test_auto_gives_its_forced_choices_image_and_forges(server: Server, own: Image) -> None:
    forge, plain = server, own
    f = forge.forge
    # What the Plan says auto chooses, for this generation's steps and CFG (forge_client: 2, 5).
    answer = plan(forge, enabled=True, vram_budget="", steps=2, cfg_scale=5)
    (unet,) = answer["networks"]
    layouts = f.stats()["layouts"]
    auto = f.txt2img(ferry(**AUTO))
    assert auto.same_as(plain), f"auto: {auto.infotext}\n{forge.log_tail()}"
    blocks, tier, depth = chosen(auto)
    (o,) = f.stats()["offloads"]
    assert (o["tier"], o["level"], o["prefetch_depth"]) == (tier, "block", depth), o
    assert (unet["tier"], unet["blocks_per_group"], unet["prefetch_depth"]) == (tier, blocks, depth)
    assert f.stats()["layouts"] == layouts + 1
    # The same settings forced by hand: the same offload (Forge keeps auto's layout), the
    # same image.
    forced = f.txt2img(ferry(tier=tier, blocks=blocks, look_ahead=depth))
    assert forced.same_as(auto) and forced.same_as(plain)
    assert f.stats()["layouts"] == layouts + 1


def test_auto_with_the_text_encoder_too(server: Server, own: Image) -> None:
    """Both networks on auto, planned together: each gets its own choice, the route says the
    same, and the image (the prompt encoded through Ferry) is Forge's."""
    forge, plain = server, own
    f = forge.forge
    f.txt2img(ferry(enabled=False), prompt="another prompt")  # Forge encodes a changed prompt
    answer = plan(forge, enabled=True, vram_budget="", text_encoder=True, steps=2, cfg_scale=5)
    unet, te = answer["networks"]
    got = f.txt2img(ferry(**AUTO, text_encoder=True), prompt=PROMPT)
    assert got.same_as(plain), f"{got.infotext}\n{forge.log_tail()}"
    assert "text encoder too" in got.infotext
    # The text encoder's line is named by the encoders Forge's CLIP holds (webui/script.py).
    stats = {o["name"]: o for o in f.stats()["offloads"]}
    assert set(stats) == {"ferry-sd15-a", "clip_l"}, stats
    for said, name in ((unet, "ferry-sd15-a"), (te, "clip_l")):
        o = stats[name]
        assert (o["tier"], o["prefetch_depth"]) == (said["tier"], said["prefetch_depth"]), o
    assert chosen(got) == (unet["blocks_per_group"], unet["tier"], unet["prefetch_depth"])
    f.txt2img(ferry(enabled=False))


def test_the_plan_counts_the_steps_and_cfg(server: Server, own: Image) -> None:
    forge = server  # a checkpoint loaded (own)
    for steps, cfg, reads, passes in ((2, 5, 4, "two"), (7, 1, 7, "one"), (30, 7, 60, "two")):
        text = plan(forge, enabled=True, steps=steps, cfg_scale=cfg)["text"]
        assert f"Planned for {steps} steps at CFG {cfg} ({passes} pass" in text, text
        assert f"the UNet is read {reads} times a generation." in text, text
