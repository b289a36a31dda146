"""Real ComfyUI (issue 12): after each fault, ComfyUI runs the next prompt with no restart.

Faults: the disk filling while a layout is written (a real small tmpfs), a read failing with
EIO, ``POST /interrupt`` mid-sampling, an exception raised inside a block, and a damaged group
file of a model loaded by Ferry's own loader (repaired from its checkpoint). The prompt that
meets a fault succeeds with the reference latent or fails with a node error in ComfyUI's
words; then the same graph, the graph with a changed Ferry widget and the graph with the Ferry
node bypassed each give the latent ComfyUI makes without Ferry, bit for bit. Each prompt
changes the sampler's seed: ComfyUI skips a sampler whose inputs did not change. The faults
are injected at the operating-system boundary by the test-only node pack
(ferry_test_nodes.py, which says why each is faithful).
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ferry_workflows import MODEL_FILE, Client, error_message, ferry, graph
from test_comfyui_real import live, run_ok

from tests.helpers import flip_byte, tmpfs

_seeds = itertools.count(1000)
Chain = list[tuple[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def client(server: Any) -> Client:
    return Client(server.url)


@pytest.fixture(scope="module")
def refs() -> dict[tuple[int, str], torch.Tensor]:
    return {}


@pytest.fixture
def faults(client: Client) -> Iterator[Callable[..., None]]:
    def arm(fault: str, **params: Any) -> None:
        status, _ = client.post("/ferry_test/arm", {"fault": fault, **params})
        assert status == 200

    yield arm
    client.post("/ferry_test/disarm", {})


def fired(client: Client, fault: str) -> int:
    return int(client.get("/ferry_test/state")["fired"][fault])


def unet(dtype: str = "default") -> tuple[str, dict[str, Any]]:
    return ("UNETLoader", {"unet_name": MODEL_FILE, "weight_dtype": dtype})


#: The faults meet Ferry's group files, so the model is one whose groups are written: cast by
#: its loader. An unchanged model is read in place from its own file, and nothing is written
#: (issue 48; tests/comfyui/test_comfyui_in_place.py).
CAST = "fp8_e4m3fn"


def reference(
    client: Client, server: Any, refs: dict[tuple[int, str], torch.Tensor], seed: int, dtype: str
) -> torch.Tensor:
    if (seed, dtype) not in refs:
        g = graph([], f"ref-{seed}-{dtype}", loader=unet(dtype), seed=seed)
        refs[seed, dtype] = run_ok(client, server, g)
    return refs[seed, dtype]


def disk(folder: Path, **over: Any) -> tuple[str, dict[str, Any]]:
    return ferry(tier="disk", disk_path=str(folder), **over)


def recovers(client: Client, server: Any, refs: Any, folder: Path) -> None:
    """The same graph, a changed Ferry widget, the Ferry node bypassed: each bit-equal."""
    for name, chain in (
        ("same", [disk(folder)]),
        ("widget", [disk(folder, prefetch_depth=2)]),
        ("bypassed", []),
    ):
        seed = next(_seeds)
        want = reference(client, server, refs, seed, CAST)
        got = run_ok(client, server, graph(chain, f"next-{name}", loader=unet(CAST), seed=seed))
        assert torch.equal(got, want), name


def laid_out(client: Client, server: Any, refs: Any, folder: Path) -> None:
    seed = next(_seeds)
    want = reference(client, server, refs, seed, CAST)
    laid = graph([disk(folder)], "laid", loader=unet(CAST), seed=seed)
    assert torch.equal(run_ok(client, server, laid), want)
    assert any(str(o["disk_folder"]).startswith(str(folder)) for o in live(client))


def failed_prompt(client: Client, folder: Path, fault: str, label: str, why: str) -> str:
    """Runs the graph through Ferry on ``folder`` with ``fault`` armed: the fault fired once
    (``why`` says what it means if not) and the prompt failed; returns its error message."""
    entry = client.run(graph([disk(folder)], label, loader=unet(CAST), seed=next(_seeds)))
    assert fired(client, fault) == 1, why
    assert entry["status"]["status_str"] == "error", f"the {fault} fault must fail the prompt"
    msg = error_message(entry)
    print("MESSAGE:", msg)
    return msg


def no_python(msg: str) -> None:
    for python in ("handle", "remove()", "find_offload", "apply_offload", "Traceback"):
        assert python not in msg, msg


def test_disk_fills_while_a_layout_is_written(
    client: Client, server: Any, refs: Any, faults: Any, tmp_path: Path
) -> None:
    model = server.base / "models" / "diffusion_models" / MODEL_FILE
    size_kb = (model.stat().st_size + (80 << 20)) >> 10  # room for the check's 64 MB margin
    with tmpfs(tmp_path / "small-disk", f"{size_kb}k") as mnt:
        faults("fill", folder=str(mnt), ballast=str(mnt / "ballast"))
        msg = failed_prompt(client, mnt, "fill", "fill", "the disk did not fill mid-layout")
        assert msg.startswith("KSampler: disk_path: the disk filled up while writing group-"), msg
        assert str(mnt) in msg and "nothing was lost" in msg, msg
        no_python(msg)
        assert list(mnt.rglob("group-*")) == [], "no group file left behind"
        (mnt / "ballast").unlink()  # the user frees space, as the message says
        recovers(client, server, refs, mnt)
        # Ferry's folder is gone; the folder's read speed may stay (issue 47's disk probe).
        left = sorted(p.name for p in mnt.iterdir())
        assert left in ([], [".ferry-disk-speed.json"]), f"Ferry left its folder behind: {left}"


def test_a_read_failing_with_eio(
    client: Client, server: Any, refs: Any, faults: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "eio-disk"
    laid_out(client, server, refs, folder)
    faults("eio", folder=str(folder), count=1)
    msg = failed_prompt(client, folder, "eio", "eio", "no read met the EIO")
    assert msg.startswith("KSampler: Ferry Offload Model: reading a group file in the disk"), msg
    assert str(folder) in msg and "Input/output error" in msg and "layout is kept" in msg, msg
    no_python(msg)
    recovers(client, server, refs, folder)


def test_interrupt_mid_sampling(client: Client, server: Any, refs: Any, tmp_path: Path) -> None:
    folder = tmp_path / "interrupt-disk"
    laid_out(client, server, refs, folder)
    status, body = client.queue(
        graph([disk(folder)], "long", loader=unet(CAST), seed=next(_seeds), steps=5000)
    )
    assert status == 200
    pid = body["prompt_id"]
    deadline = time.monotonic() + 60
    while not any(item[1] == pid for item in client.get("/queue")["queue_running"]):
        assert time.monotonic() < deadline, "the prompt never started"
        time.sleep(0.1)
    time.sleep(3)  # into the sampling loop: the tiny model takes ~0.03 s a step
    client.post("/interrupt", {})
    entry = client.wait(pid)
    kinds = [kind for kind, _ in entry["status"]["messages"]]
    assert "execution_interrupted" in kinds, kinds
    recovers(client, server, refs, folder)


def test_an_exception_inside_a_block(
    client: Client, server: Any, refs: Any, faults: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "raise-disk"
    laid_out(client, server, refs, folder)
    faults("block", at=2)  # the second block's forward of the next prompt
    msg = failed_prompt(client, folder, "block", "raise", "no block raised")
    assert msg.strip() == "KSampler: ferry test: a block raised inside its forward", msg
    recovers(client, server, refs, folder)


# -- Ferry's own loader: a damaged group file is rewritten from the checkpoint ------------------


def _replace_with_another(files: list[Path]) -> None:
    tmp = files[1].with_name("other.tmp")
    shutil.copyfile(files[0], tmp)
    os.replace(tmp, files[1])


DAMAGE = {
    "truncated": lambda files: os.truncate(files[1], files[1].stat().st_size - 100),
    "flipped": lambda files: flip_byte(files[1], keep_mtime=True),
    "replaced": _replace_with_another,
    "folder-deleted": lambda files: shutil.rmtree(files[0].parent),
}
# Damage to the file Ferry has open is found and repaired; a file replaced or deleted by name
# leaves Ferry's open descriptor on the intact old file, which it keeps reading (equal either way).
IN_PLACE = ("truncated", "flipped")
REWROTE = "was damaged; rewrote it from ferry-tiny-sd3.safetensors"
FP8 = "fp8_e4m3fn"  # a converted dtype: Ferry writes group files (an unconverted file is read)


def ferry_loader(folder: Path, nxt: str) -> dict[str, Any]:
    inputs = {"unet_name": MODEL_FILE, "quant_preset": "none", "cache": False, "weight_dtype": FP8}
    chain: Chain = {
        "unchanged": [disk(folder)],
        "changed-widget": [disk(folder, prefetch_depth=2)],
        "ferry-bypassed": [],
    }[nxt]
    return {"loader": ("FerryLoadDiffusionModelQuantized", inputs), "model_chain": chain}


@pytest.mark.parametrize("nxt", ["unchanged", "changed-widget", "ferry-bypassed"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_ferry_loader_repairs_a_damaged_group_file(
    client: Client, server: Any, refs: Any, tmp_path: Path, damage: str, nxt: str
) -> None:
    folder = tmp_path / "loader-disk"
    s0, s1, s2 = next(_seeds), next(_seeds), next(_seeds)
    want = {s: reference(client, server, refs, s, FP8) for s in (s0, s1, s2)}
    first = run_ok(
        client, server, graph(prefix="laid", seed=s0, **ferry_loader(folder, "unchanged"))
    )
    assert torch.equal(first, want[s0])
    (o,) = [o for o in live(client) if str(o["disk_folder"]).startswith(str(folder))]
    files = sorted(Path(o["disk_folder"]).glob("group-*.safetensors"))
    assert len(files) >= 2, "the fp8 conversion writes group files"
    rewrote = server.log.read_text(errors="replace").count(REWROTE)
    DAMAGE[damage](files)
    meets = run_ok(client, server, graph(prefix="meets", seed=s1, **ferry_loader(folder, nxt)))
    assert torch.equal(meets, want[s1])
    if nxt == "unchanged" and damage in IN_PLACE:
        assert server.log.read_text(errors="replace").count(REWROTE) > rewrote, "repaired"
    after = run_ok(client, server, graph(prefix="after", seed=s2, **ferry_loader(folder, nxt)))
    assert torch.equal(after, want[s2])
