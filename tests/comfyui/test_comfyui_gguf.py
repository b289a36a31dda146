"""GGUF through Ferry in real ComfyUI with the real ComfyUI-GGUF pack: what most low-VRAM users
load. Opt-in twice over: FERRY_COMFYUI (the core) and FERRY_COMFYUI_GGUF (a ComfyUI-GGUF
checkout; its venv needs the ``gguf`` package), e.g.

    FERRY_COMFYUI=/work/comfy/v0.33.0 FERRY_COMFYUI_GGUF=/work/comfy/ComfyUI-GGUF \\
        python -m pytest tests/comfyui/test_comfyui_gguf.py -q

Tiny Wan 2.1 and HunyuanVideo models (core's classes), written as GGUF the way its conversion
tools write them (make_gguf_models.py: Q8_0; and Q4_K/Q5_K with Q8_0, F16 and F32), are loaded
by ``UnetLoaderGGUF``. Every latent is compared bit for bit with the same chain without Ferry,
and each Ferry run must show that Ferry ran the model (its live offload counted forwards and
moved bytes in that prompt): an equal latent from a run without Ferry proves nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import HERE, REPO, Server, comfy_checkout, start_server, stop_server
from ferry_workflows import Client, error_message, ferry, graph, saved_latent_name
from safetensors.torch import load_file

GGUF_PACK = os.environ.get("FERRY_COMFYUI_GGUF")
pytestmark = pytest.mark.skipif(
    not GGUF_PACK, reason="set FERRY_COMFYUI_GGUF to a ComfyUI-GGUF checkout to run these"
)

MODELS = [("wan", "q8_0"), ("wan", "k"), ("hyvid", "q8_0"), ("hyvid", "k")]
#: What each architecture's graph needs: Wan reads 4096-wide text; HunyuanVideo 32-wide text
#: (its context width is read from the file) and a 768-wide pooled vector.
COND = {"wan": {"dim": 4096}, "hyvid": {"dim": 32, "pooled": 768}}
LATENT = ("EmptyHunyuanLatentVideo", {"width": 32, "height": 32, "length": 1, "batch_size": 1})


def gguf_base(base: Path, *model_args: str) -> Path:
    """A ComfyUI base directory with this pack, ComfyUI-GGUF and the test nodes in
    custom_nodes/, and the GGUF models make_gguf_models.py writes (``model_args``: ``--big N``)."""
    comfy, py = comfy_checkout()
    custom = base / "custom_nodes"
    custom.mkdir()
    (custom / "ComfyUI-Ferry").symlink_to(REPO, target_is_directory=True)
    (custom / "ComfyUI-GGUF").symlink_to(Path(str(GGUF_PACK)).resolve(), target_is_directory=True)
    shutil.copy(HERE / "ferry_test_nodes.py", custom / "ferry_test_nodes.py")
    cmd = [py, str(HERE / "make_gguf_models.py"), str(comfy), str(base / "models"), *model_args]
    subprocess.run(cmd, check=True, cwd=base, timeout=900)
    return base


@pytest.fixture(scope="module")
def gserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    comfy, py = comfy_checkout()
    base = gguf_base(tmp_path_factory.mktemp("comfy-gguf"))
    srv = start_server(comfy, py, base)
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def client(gserver: Server) -> Client:
    c = Client(gserver.url)
    assert "UnetLoaderGGUF" in c.get("/object_info/UnetLoaderGGUF"), "ComfyUI-GGUF did not load"
    return c


def loader(arch: str, mix: str) -> tuple[str, dict[str, Any]]:
    return ("UnetLoaderGGUF", {"unet_name": f"ferry-tiny-{arch}-{mix}.gguf"})


def lora(arch: str, strength: float = 1.0) -> tuple[str, dict[str, Any]]:
    name = f"ferry-tiny-{arch}-lora.safetensors"
    return ("LoraLoaderModelOnly", {"lora_name": name, "strength_model": strength})


SAMPLING = ("ModelSamplingSD3", {"shift": 3.0})  # clones the MODEL (GGUF's clone resets class)


def forwards(client: Client) -> int:
    return sum(int(o.get("forwards", 0)) for o in client.get("/ferry/stats")["offloads"])


def run(client: Client, srv: Server, arch: str, mix: str, chain: list[Any], name: str, **kw):
    g = graph(chain, name, loader=loader(arch, mix), latent=LATENT, cond=COND[arch], steps=2, **kw)
    entry = client.run(g)
    assert entry["status"]["status_str"] == "success", f"{error_message(entry)}\n{srv.log_tail()}"
    return load_file(str(srv.base / "output" / saved_latent_name(entry)))["latent_tensor"]


def run_ferry(client: Client, srv: Server, arch: str, mix: str, chain: list[Any], name: str):
    """Runs a chain with Ferry in it; asserts Ferry ran the model in this prompt."""
    before = forwards(client)
    laid = srv.log.read_text(errors="replace").count("ferry: laid out")
    got = run(client, srv, arch, mix, chain, name)
    log = srv.log.read_text(errors="replace")
    anew = log.count("ferry: laid out") > laid
    # A new layout counts its forwards from 0; a kept one goes on counting.
    ran = forwards(client) > (0 if anew else before)
    assert ran, f"{name}: the model ran without Ferry\n{srv.log_tail()}"
    assert "WITHOUT Ferry" not in log, srv.log_tail()
    return got, anew


@pytest.mark.parametrize("arch,mix", MODELS)
def test_gguf_through_ferry_in_every_tier(client: Client, gserver: Server, arch: str, mix: str):
    want = run(client, gserver, arch, mix, [], f"{arch}-{mix}-plain")
    assert torch.isfinite(want).all()
    cases = [
        dict(tier=tier, level=level, prefetch_depth=2)
        for tier in ("pinned", "ram", "disk")
        for level in ("block", "leaf")
    ]
    cases.append(dict(tier="ram", level="block", vram_budget="auto"))
    for i, case in enumerate(cases):
        got, laid = run_ferry(client, gserver, arch, mix, [ferry(**case)], f"{arch}-{mix}-f{i}")
        assert laid, f"{case}: Ferry laid the model out"
        assert torch.equal(got, want), case


@pytest.mark.parametrize("arch,mix", MODELS)
def test_a_cloning_node_after_ferry_keeps_ferry(
    client: Client, gserver: Server, arch: str, mix: str
) -> None:
    want = run(client, gserver, arch, mix, [SAMPLING], f"{arch}-{mix}-ms")
    for tier in ("ram", "disk"):
        chain = [ferry(tier=tier), SAMPLING]
        got, _ = run_ferry(client, gserver, arch, mix, chain, f"{arch}-{mix}-f-ms-{tier}")
        assert torch.equal(got, want), tier


@pytest.mark.parametrize("arch,mix", MODELS)
def test_lora_before_and_after_ferry(client: Client, gserver: Server, arch: str, mix: str):
    plain = run(client, gserver, arch, mix, [], f"{arch}-{mix}-plain-l")
    want = run(client, gserver, arch, mix, [lora(arch)], f"{arch}-{mix}-lora")
    assert not torch.equal(want, plain), "the LoRA changes the latent"
    for tier in ("pinned", "ram", "disk"):
        got, _ = run_ferry(
            client, gserver, arch, mix, [ferry(tier=tier), lora(arch)], f"{arch}-{mix}-fl-{tier}"
        )
        assert torch.equal(got, want), f"Ferry then LoRA, {tier}"
        got, _ = run_ferry(
            client, gserver, arch, mix, [lora(arch), ferry(tier=tier)], f"{arch}-{mix}-lf-{tier}"
        )
        assert torch.equal(got, want), f"LoRA then Ferry, {tier}"
    # And back: the same Ferry node without the LoRA gives the plain latent.
    got, _ = run_ferry(client, gserver, arch, mix, [ferry(tier="disk")], f"{arch}-{mix}-back")
    assert torch.equal(got, plain)


#: Four LoRAs (the test's one file, four times at different strengths): what ComfyUI-GGUF
#: patches on every forward, and what ``bake_lora`` computes once.
FOUR_LORAS = [1.0, 0.5, -0.3, 0.7]


@pytest.mark.parametrize("arch,mix", MODELS)
def test_baked_lora_equals_per_forward_in_every_tier(
    client: Client, gserver: Server, arch: str, mix: str
) -> None:
    """``bake_lora on``: the latent equals UnetLoaderGGUF + LoraLoaderModelOnly without Ferry,
    in every tier and with the LoRAs before or after Ferry; the log says it baked. Off and
    auto too (auto bakes or not as it measured; either is exact)."""
    loras = [lora(arch, s) for s in FOUR_LORAS]
    want = run(client, gserver, arch, mix, loras, f"{arch}-{mix}-4l")
    plain = run(client, gserver, arch, mix, [], f"{arch}-{mix}-plain-4l")
    assert not torch.equal(want, plain)
    cases = [(tier, "on") for tier in ("pinned", "ram", "disk")] + [("ram", "off"), ("ram", "auto")]
    for i, (tier, bake) in enumerate(cases):
        baked = gserver.log.read_text(errors="replace").count("patched weights")
        for order in ("fl", "lf"):
            node = ferry(tier=tier, bake_lora=bake, level="leaf" if i % 2 else "block")
            chain = [node, *loras] if order == "fl" else [*loras, node]
            got, _ = run_ferry(client, gserver, arch, mix, chain, f"{arch}-{mix}-b{i}{order}")
            assert torch.equal(got, want), (tier, bake, order)
        said = gserver.log.read_text(errors="replace").count("patched weights") > baked
        assert said or bake == "off", (tier, bake, gserver.log_tail())
