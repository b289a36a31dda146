"""Real ComfyUI (issue 12): a damaged Ferry disk folder never strands the model.

A model cast by UNETLoader (weight_dtype fp8_e4m3fn) lives only in RAM before Ferry lays it out
on the disk tier (an unchanged one is read in place from its file and nothing is written: issue
48), so a damaged group file held the only copy of its weights: the prompt that meets the damage fails with a
node error in ComfyUI's words (or succeeds: a deleted file's open descriptor still reads), and
the next prompt, unchanged, with a changed Ferry widget, or with the Ferry node bypassed, gives
the latent ComfyUI makes without Ferry, bit for bit, with no restart. Each prompt changes the
sampler's seed: ComfyUI skips a sampler whose inputs did not change.
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from ferry_workflows import MODEL_FILE, Client, error_message, ferry, graph
from test_comfyui_real import latent, live, run_ok

from tests.helpers import flip_byte

_seeds = itertools.count(100)
#: A cast model: its groups are written to the disk folder (see the module's docstring).
CAST = ("UNETLoader", {"unet_name": MODEL_FILE, "weight_dtype": "fp8_e4m3fn"})


@pytest.fixture(scope="module")
def client(server: Any) -> Client:
    return Client(server.url)


@pytest.fixture(scope="module")
def refs(client: Client, server: Any) -> dict[int, torch.Tensor]:
    return {}


def reference(
    client: Client, server: Any, refs: dict[int, torch.Tensor], seed: int
) -> torch.Tensor:
    if seed not in refs:
        refs[seed] = run_ok(client, server, graph([], f"ref-{seed}", loader=CAST, seed=seed))
    return refs[seed]


FAULTS = {
    "truncated": lambda files: os.truncate(files[1], files[1].stat().st_size - 100),
    "flipped": lambda files: flip_byte(files[1], keep_mtime=True),
    "folder-deleted": lambda files: shutil.rmtree(files[0].parent),
    "file-deleted": lambda files: files[1].unlink(),
    # Another group's file (a real, well-formed Ferry file) written over it, in place...
    "overwritten": lambda files: shutil.copyfile(files[0], files[1]),
    # ...or renamed over it (a new inode: Ferry's open descriptor still reads the old one).
    "renamed-over": lambda files: os.replace(
        shutil.copyfile(files[0], files[1].with_suffix(".new")), files[1]
    ),
}
NEXT = {
    "unchanged": lambda: [ferry(tier="disk")],
    "changed-widget": lambda: [ferry(tier="disk", prefetch_depth=2)],
    "ferry-bypassed": lambda: [],
}


@pytest.mark.parametrize("nxt", list(NEXT))
@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_next_prompt_after_a_damaged_folder_is_bit_equal(
    client: Client, server: Any, refs: dict[int, torch.Tensor], fault: str, nxt: str
) -> None:
    s0, s1, s2 = next(_seeds), next(_seeds), next(_seeds)
    want = {s: reference(client, server, refs, s) for s in (s0, s1, s2)}
    assert torch.equal(
        run_ok(client, server, graph([ferry(tier="disk")], "laid", loader=CAST, seed=s0)), want[s0]
    )
    (o,) = live(client)
    files = sorted(Path(o["disk_folder"]).glob("group-*.safetensors"))
    assert len(files) >= 2
    said = server.log.read_text(errors="replace").count(
        "ferry: Ferry Offload Model: the group file"
    )
    FAULTS[fault](files)
    entry = client.run(graph(NEXT[nxt](), f"meets-{fault}", loader=CAST, seed=s1))
    if entry["status"]["status_str"] == "error":
        msg = error_message(entry)
        assert files[1].name in msg or files[0].name in msg, msg
        assert "ComfyUI loads the model again from its file before the next prompt" in msg, msg
        for python in ("handle", "remove()", "apply it again", "find_offload"):
            assert python not in msg, msg
        print("MESSAGE:", msg)
        now = server.log.read_text(errors="replace").count(
            "ferry: Ferry Offload Model: the group file"
        )
        assert now == said + 1, "said once"
    else:
        assert torch.equal(latent(server, entry), want[s1])
    after = run_ok(client, server, graph(NEXT[nxt](), f"after-{fault}", loader=CAST, seed=s2))
    assert torch.equal(after, want[s2])
