"""Two experts of one class in one prompt (Wan 2.2's pair: both "model: WanModel"), in real
ComfyUI: each line of /ferry/stats and of Ferry Memory Report shows its own planner's
sentence and its own disk reads (issue 46). Before, the sentence was kept in a table keyed by
the line's title, written before the layout's unique name existed: the first expert showed the
second's sentence and the second ("WanModel-2") none.

    UNETLoader (wan)           -> Ferry Offload Model (disk, groups auto) -> KSamplerAdvanced 0..1
    UNETLoader (wan fp8_scaled) -> Ferry Offload Model (disk, groups auto) -> KSamplerAdvanced 1..4
                                                                          -> Ferry Memory Report

Both latents equal core's without Ferry.

    FERRY_COMFYUI=/work/comfy/v0.33.0 python -m pytest tests/comfyui/test_comfyui_experts.py
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import Server, comfy_checkout, make_base, run_maker, start_server, stop_server
from ferry_workflows import Client, error_message, ferry, saved_latent_name
from safetensors.torch import load_file

from offload_core.units import fmt_bytes

HIGH, LOW = "ferry-q-wan.safetensors", "ferry-q-wan-fp8scaled.safetensors"
LATENT = ("EmptyHunyuanLatentVideo", {"width": 32, "height": 32, "length": 1, "batch_size": 1})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-experts")
    make_base(base, py, comfy, "make_text_encoders.py")
    run_maker(base, py, comfy, "make_quant_models.py")
    srv = start_server(comfy, py, base)
    try:
        yield srv
    finally:
        stop_server(srv)


def experts_graph(prefix: str, with_ferry: bool, seed: int) -> dict[str, Any]:
    # The tier forced to disk (disk reads to show), the groups and look-ahead the planner's:
    # each node gets a sentence naming its own file.
    off = ferry(tier="disk", blocks_per_group="auto", prefetch_depth="auto")[1]
    g: dict[str, Any] = {}

    def model(nid: str, name: str) -> list[Any]:
        g[nid] = {
            "class_type": "UNETLoader",
            "inputs": {"unet_name": name, "weight_dtype": "default"},
        }
        if not with_ferry:
            return [nid, 0]
        g[nid + "0"] = {"class_type": "FerryOffloadModel", "inputs": {"model": [nid, 0], **off}}
        return [nid + "0", 0]

    high, low = model("1", HIGH), model("2", LOW)
    g["3"] = {"class_type": "FerryTestConditioning", "inputs": {"seed": 1, "dim": 4096}}
    g["4"] = {"class_type": "FerryTestConditioning", "inputs": {"seed": 2, "dim": 4096}}
    g["5"] = {"class_type": LATENT[0], "inputs": LATENT[1]}
    common = {"positive": ["3", 0], "negative": ["4", 0], "noise_seed": seed, "steps": 4,
              "cfg": 2.0, "sampler_name": "euler", "scheduler": "simple"}  # fmt: skip
    g["6"] = {"class_type": "KSamplerAdvanced",
              "inputs": {**common, "model": high, "latent_image": ["5", 0], "add_noise": "enable",
                         "start_at_step": 0, "end_at_step": 1,
                         "return_with_leftover_noise": "enable"}}  # fmt: skip
    g["7"] = {"class_type": "KSamplerAdvanced",
              "inputs": {**common, "model": low, "latent_image": ["6", 0], "add_noise": "disable",
                         "start_at_step": 1, "end_at_step": 4,
                         "return_with_leftover_noise": "disable"}}  # fmt: skip
    g["8"] = {
        "class_type": "SaveLatent",
        "inputs": {"samples": ["7", 0], "filename_prefix": prefix},
    }
    if with_ferry:
        g["9"] = {"class_type": "FerryMemoryReport", "inputs": {"after": ["7", 0]}}
    return g


def run(client: Client, server: Server, g: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    entry = client.run(g)
    assert entry["status"]["status_str"] == "success", (
        f"{error_message(entry)}\n{server.log_tail()}"
    )
    path = server.base / "output" / saved_latent_name(entry)
    return load_file(str(path))["latent_tensor"], entry


class StatsPoller:
    """GETs /ferry/stats every 20 ms while a prompt runs, as an open sidebar does: the route
    tells the per-prompt reads which prompt runs, before its samplers read anything."""

    def __init__(self, client: Client) -> None:
        self.client, self.stop = client, threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    def poll(self) -> None:
        while not self.stop.wait(0.02):
            self.client.live()

    def __enter__(self) -> StatsPoller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def test_each_expert_shows_its_own_sentence_and_disk_reads(server: Server) -> None:
    client = Client(server.url)
    want, _ = run(client, server, experts_graph("experts-plain", False, seed=5))
    got, _ = run(client, server, experts_graph("experts-ferry", True, seed=5))
    assert torch.equal(got, want)
    first = {line["name"]: line for line in client.live()}
    # Laid out in the order the samplers load them: the high-noise expert first.
    assert sorted(first) == ["WanModel", "WanModel-2"], list(first)
    stems = {
        "WanModel": HIGH.removesuffix(".safetensors"),
        "WanModel-2": LOW.removesuffix(".safetensors"),
    }
    for name, line in first.items():
        other = stems["WanModel-2" if name == "WanModel" else "WanModel"]
        assert line["title"] == f"model: {name}"
        assert line["why"] and line["why"].startswith("disk: set on its node"), line
        assert f"model {stems[name]})" in line["why"] and f"model {other})" not in line["why"], line
    # A second prompt on the layouts kept: each line's reads this prompt are its own layout's.
    with StatsPoller(client):
        got, entry = run(client, server, experts_graph("experts-ferry-2", True, seed=6))
    lines = {line["name"]: line for line in client.live()}
    assert sorted(lines) == ["WanModel", "WanModel-2"], list(lines)
    assert [lines[n]["why"] for n in first] == [first[n]["why"] for n in first]
    read = {n: lines[n]["bytes_disk"] - first[n]["bytes_disk"] for n in lines}
    # Both read from disk (one step against three, float32 against fp8: the reads differ).
    assert read["WanModel"] > 0 and read["WanModel-2"] > 0, read
    assert read["WanModel"] != read["WanModel-2"], read
    assert {n: lines[n]["disk_read_last_prompt"] for n in lines} == read
    # The memory report (taken after the low-noise sampler) says the same, line by line.
    (text,) = [o["text"][0] for o in entry["outputs"].values() if "text" in o]
    blocks = text.split("model: ")[1:]
    by_name = {b.split(":")[0]: b for b in blocks}
    assert sorted(by_name) == ["WanModel", "WanModel-2"], text
    for name, block in by_name.items():
        assert f"  why: {first[name]['why']}" in block, text
        assert f"read from disk this prompt: {fmt_bytes(read[name])}" in block, text
    plain = run(client, server, experts_graph("experts-plain-2", False, seed=6))[0]
    assert torch.equal(got, plain)
