"""torch.compile with Ferry in real ComfyUI: core's TorchCompileModel (inductor) before or
after Ferry Offload Model compiles the repeated blocks, Ferry streams their weights between
them, and the sample equals the same compiled graphs without Ferry (Ferry Compile Blocks)
bit for bit. The graphs compiled are counted by dynamo's own counter, printed by a test node
after each sample: a second prompt compiles nothing."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from ferry_workflows import Client, error_message, ferry, graph, saved_latent_name
from safetensors.torch import load_file

CORE_COMPILE = ("TorchCompileModel", {"backend": "inductor"})
BLOCKS_COMPILE = ("FerryCompileBlocks", {"backend": "inductor"})


@pytest.fixture(scope="module")
def client(server: Any) -> Client:
    return Client(server.url)


def counted(chain: list[tuple[str, dict[str, Any]]], prefix: str, seed: int) -> dict[str, Any]:
    """``graph`` with FerryTestDynamoGraphs between the sampler and SaveLatent."""
    g = graph(chain, prefix, seed=seed)
    g["7"] = {"class_type": "FerryTestDynamoGraphs", "inputs": {"samples": ["5", 0]}}
    g["6"]["inputs"]["samples"] = ["7", 0]
    return g


def dynamo_graphs(server: Any) -> int:
    found = re.findall(r"ferry-test: dynamo graphs (\d+)", server.log.read_text(errors="replace"))
    assert found, f"the test node printed nothing:\n{server.log_tail()}"
    return int(found[-1])


def run_ok(client: Client, server: Any, g: dict[str, Any]) -> torch.Tensor:
    entry = client.run(g, timeout=600)
    assert entry["status"]["status_str"] == "success", (
        f"{error_message(entry)}\n{server.log_tail()}"
    )
    return load_file(str(server.base / "output" / saved_latent_name(entry)))["latent_tensor"]


def said(server: Any, text: str) -> int:
    return server.log.read_text(errors="replace").count(text)


@pytest.fixture(scope="module")
def blocks_reference(client: Client, server: Any) -> dict[int, torch.Tensor]:
    """The compiled blocks without Ferry, for the two seeds the tests sample."""
    return {
        seed: run_ok(client, server, counted([BLOCKS_COMPILE], f"blocks-{seed}", seed))
        for seed in (7, 8)
    }


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def test_ferry_compile_blocks_speaks_as_torch_compile_model(client: Client) -> None:
    info = client.get("/object_info")
    ours, core = info["FerryCompileBlocks"], info["TorchCompileModel"]
    assert ours["category"] == "Ferry" and ours["description"]
    assert (
        list(ours["input"]["required"])
        == list(core["input"]["required"])
        == [
            "model",
            "backend",
        ]
    )
    options = [spec[1].get("options", spec[0]) for spec in (
        ours["input"]["required"]["backend"], core["input"]["required"]["backend"])]  # fmt: skip
    assert options[0] == options[1], options
    assert all(opts.get("tooltip") for _, opts in ours["input"]["required"].values())


ORDERS = {
    "ferry-first": lambda tier: [ferry(tier=tier), CORE_COMPILE],
    "compile-first": lambda tier: [CORE_COMPILE, ferry(tier=tier)],
    "blocks-node-first": lambda tier: [BLOCKS_COMPILE, ferry(tier=tier)],
}


@pytest.mark.parametrize("tier", ["ram", "disk"])
@pytest.mark.parametrize("order", list(ORDERS))
def test_torch_compile_model_with_ferry_equals_the_compiled_blocks(
    client: Client, server: Any, blocks_reference: dict[int, torch.Tensor], order: str, tier: str
) -> None:
    chain = ORDERS[order](tier)
    # The prompt worker frees between prompts: on a loaded 2-core machine that took over 10 s.
    client.unload_models(within_s=120)
    laid = said(server, "ferry: laid out")
    # The reference compiled the blocks resident; streamed, they reuse those graphs.
    graphs = dynamo_graphs(server)
    out = run_ok(client, server, counted(chain, f"{order}-{tier}", 7))
    assert dynamo_graphs(server) == graphs, "the blocks recompiled under Ferry"
    assert said(server, "ferry: laid out") > laid, "Ferry Offload Model did not lay it out"
    (o,) = client.get("/ferry/stats")["offloads"]
    assert o["tier"] == tier and o["level"].startswith("block")
    assert o["group_loads"] >= o["groups"] * o["forwards"] > 0, "Ferry did not stream"
    assert torch.equal(out, blocks_reference[7]), f"max abs diff {diff(out, blocks_reference[7])}"
    # A second prompt (a new seed: ComfyUI reruns the sampler) compiles nothing.
    again = run_ok(client, server, counted(chain, f"{order}-{tier}-again", 8))
    assert dynamo_graphs(server) == graphs, "the second prompt recompiled"
    assert torch.equal(again, blocks_reference[8])


def test_compiled_once_for_every_tier_and_order(
    server: Any, blocks_reference: dict[int, torch.Tensor]
) -> None:
    """Runs after the tests above: one compile in the whole module, on the reference's first
    sample, and none under Ferry (the same graphs ran on the streamed blocks, in both tiers
    and both orders). Had core's whole-model graph run instead of the blocks', dynamo would
    have compiled its graphs there. The count is more than one per kind of block on this CPU:
    core's CPU attention (sub-quadratic) asks psutil for free memory inside each block, which
    dynamo cannot trace, so each block's forward compiles as a few graphs around that call."""
    log = server.log.read_text(errors="replace")
    lines = re.findall(r"ferry: torch\.compile compiled (\d+) graph\(s\) for (\d+) blocks", log)
    assert len(lines) == 1, lines
    graphs, blocks = int(lines[0][0]), int(lines[0][1])
    assert blocks >= 2 and graphs >= 1
    assert "(resident)" in log and "graph(s) for" in log
    assert dynamo_graphs(server) >= graphs  # core's whole graph (below) may add its own


def test_core_whole_model_compile_differs_only_by_fusion(
    client: Client, server: Any, blocks_reference: dict[int, torch.Tensor]
) -> None:
    """Core's TorchCompileModel without Ferry compiles the whole network as one graph, so
    inductor fuses across block boundaries (a block's last add with the next one's norm) and
    orders some reductions otherwise: not bit-equal to the blocks compiled apart, but within
    float32 rounding of it, and the eager sample is as far from both."""
    whole = run_ok(client, server, counted([CORE_COMPILE], "whole", 7))
    eager = run_ok(client, server, counted([], "eager", 7))
    ref = blocks_reference[7]
    scale = float(ref.abs().max())
    print(f"whole-model compile vs blocks: {diff(whole, ref):.3g}; eager vs blocks: "
          f"{diff(eager, ref):.3g}; scale {scale:.3g}")  # fmt: skip
    assert diff(whole, ref) <= 1e-5 * scale, diff(whole, ref)
    assert diff(eager, ref) <= 1e-5 * scale, diff(eager, ref)


def test_leaf_level_with_torch_compile_is_a_clear_error(client: Client, server: Any) -> None:
    entry = client.run(graph([ferry(tier="ram", level="leaf"), CORE_COMPILE], "leaf"))
    assert entry["status"]["status_str"] == "error"
    msg = error_message(entry)
    assert "choose level block" in msg and "level" in msg, msg
