"""Models bigger than RAM in real ComfyUI (issue 11), under a cgroup memory limit of less
than half the model file: Ferry's loader -> Ferry Offload Model (disk) -> KSampler completes
inside the limit with a latent bit-equal to UNETLoader -> KSampler run without a limit
(weight_dtype default and fp8_e4m3fn, and with a LoRA after the Ferry node); with the
int8-weight preset, quantized group by group as Ferry lays it out, bit-equal to the same
preset quantized whole by the cache path (Ferry loader -> KSampler, no limit); the same graph
without Ferry inside the limit is killed. On a core with dynamic VRAM (v0.33) the Ferry runs go
again with the aimdo stand-in on (ferry_standin_nodes.py: core's Linears built without weights,
a dynamic patcher class), against the same references (UNETLoader, no stand-in, no limit)."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    HAS_AIMDO,
    Server,
    comfy_checkout,
    limited_server,
    make_base,
    run_maker,
    start_server,
    stop_server,
)
from ferry_workflows import Client, error_message, ferry, graph, saved_latent_name
from make_big_model import LORA_FILE, MODEL_FILE
from safetensors.torch import load_file
from test_comfyui_dynamic_vram import loads

from tests import cgroup_limit

MB = 1 << 20
LIMIT = 750 * MB
DEPTH = 14  # hidden 896: a 1.59 GB float32 file, more than twice the limit
HERE = Path(__file__).resolve().parent
CASES = {  # weight_dtype, a LoRA after the Ferry node, quant_preset
    "default": ("default", False, "none"),
    "fp8_e4m3fn": ("fp8_e4m3fn", False, "none"),
    "lora": ("default", True, "none"),
    "int8-weight": ("default", False, "int8-weight"),
}

pytestmark = pytest.mark.skipif(
    cgroup_limit.unavailable() is not None, reason=str(cgroup_limit.unavailable())
)


def _lora() -> tuple[str, dict[str, Any]]:
    return ("LoraLoaderModelOnly", {"lora_name": LORA_FILE, "strength_model": 1.0})


def _graph(case: str, with_ferry: bool) -> dict[str, Any]:
    dtype, with_lora, preset = CASES[case]
    chain = [_lora()] if with_lora else []
    if not with_ferry and preset != "none":
        # The reference: the preset quantized whole by load_quantized (the cache path, which
        # a model that fits in RAM takes), no Ferry Offload Model, no limit.
        inputs = {"unet_name": MODEL_FILE, "quant_preset": preset, "cache": True}
        return graph(chain, f"plain-{case}", loader=("FerryLoadDiffusionModelQuantized", inputs))
    if not with_ferry:
        loader = ("UNETLoader", {"unet_name": MODEL_FILE, "weight_dtype": dtype})
        return graph(chain, f"plain-{case}", loader=loader)
    inputs = {"unet_name": MODEL_FILE, "quant_preset": preset, "cache": True}
    loader = ("FerryLoadDiffusionModelQuantized", {**inputs, "weight_dtype": dtype})
    return graph([ferry(tier="disk"), *chain], f"ferry-{case}", loader=loader)


def _run(srv: Server, g: dict[str, Any]) -> torch.Tensor:
    entry = Client(srv.url).run(g, timeout=600)
    assert entry["status"]["status_str"] == "success", f"{error_message(entry)}\n{srv.log_tail()}"
    return load_file(str(srv.base / "output" / saved_latent_name(entry)))["latent_tensor"]


def _free(srv: Server) -> None:
    """Unloads every model (ComfyUI's /free, done by its worker when idle)."""
    Client(srv.url).post("/free", {"unload_models": True, "free_memory": True})
    time.sleep(3)


@pytest.fixture(scope="module")
def big_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-big")
    make_base(base, py, comfy)
    run_maker(base, py, comfy, "make_big_model.py", str(DEPTH), timeout=600)
    assert (base / "models" / "diffusion_models" / MODEL_FILE).stat().st_size >= 2 * LIMIT
    return base


@pytest.fixture(scope="module")
def references(big_base: Path) -> dict[str, torch.Tensor]:
    comfy, py = comfy_checkout()
    srv = start_server(comfy, py, big_base)
    try:
        out = {}
        for case in CASES:
            out[case] = _run(srv, _graph(case, with_ferry=False))
            _free(srv)
        return out
    finally:
        stop_server(srv)


FIELDS = ("RssAnon", "VmHWM")  # /proc/<pid>/status


class RssAnonPeak:
    """Samples a process's RssAnon (its own memory, not the page cache) on a thread; ``hwm``
    is the kernel's VmHWM (its RSS peak, mapped file pages too) at the last sample."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.hwm = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                text = Path(f"/proc/{self.pid}/status").read_text()
                anon, hwm = (int(text.split(f"{k}:")[1].split()[0]) * 1024 for k in FIELDS)
            except (OSError, IndexError):  # gone, or a zombie (no memory lines left)
                return
            self.peak, self.hwm = max(self.peak, anon), max(self.hwm, hwm)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def _limited(big_base: Path, standin: str) -> Iterator[Any]:
    name = f"ferry-19-{standin or 'off'}"
    with limited_server(big_base, LIMIT, name, standin=standin) as (srv, group):
        yield srv, group, standin


STANDINS = ["", "aimdo"] if HAS_AIMDO else [""]


@pytest.fixture(scope="module", params=STANDINS, ids=lambda s: f"standin-{s or 'off'}")
def limited(
    big_base: Path, references: dict[str, torch.Tensor], request: pytest.FixtureRequest
) -> Iterator[Any]:
    yield from _limited(big_base, request.param)


@pytest.fixture(scope="module")
def limited_plain(big_base: Path, references: dict[str, torch.Tensor]) -> Iterator[Any]:
    yield from _limited(big_base, "")


@pytest.mark.parametrize("case", list(CASES))
def test_ferry_loader_runs_the_model_inside_the_limit(case: str, limited: Any, references) -> None:  # type: ignore[no-untyped-def]
    srv, group, standin = limited
    state = loads(srv)
    assert state["aimdo_enabled"] == (standin == "aimdo")
    rss = RssAnonPeak(srv.proc.pid)
    latent = _run(srv, _graph(case, with_ferry=True))
    peak = rss.stop()
    print(
        f"{case} (aimdo stand-in {'on' if standin else 'off'}): peak RssAnon {peak / MB:.0f} MB,"
        f" cgroup peak {group.max_usage / MB:.0f} MB"
    )
    assert srv.proc.poll() is None
    assert torch.equal(latent, references[case])
    if CASES[case][2] != "none":  # the path the loader took, as its log says
        assert "quantizing group by group" in srv.log.read_text(errors="replace")
    _free(srv)


def test_the_same_graph_without_ferry_is_killed_inside_the_limit(limited_plain: Any) -> None:
    srv, _group, _ = limited_plain
    client = Client(srv.url)
    status, _ = client.queue(_graph("default", with_ferry=False))
    assert status == 200
    try:
        srv.proc.wait(timeout=300)
    except Exception:
        pytest.fail("UNETLoader -> KSampler survived a limit of less than half the file")
    assert srv.proc.returncode == -9, srv.log_tail()
    with pytest.raises(OSError):
        urllib.request.urlopen(srv.url + "/ferry/stats", timeout=5)
