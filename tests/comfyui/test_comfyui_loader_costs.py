"""Each loader's own RAM cost on this core, against the table the pre-flight plans with
(offload_core/planner/loader_costs.py; issue 47).

One ComfyUI runs, for each loader in turn, a prompt of that loader (its network held by a
test output node) beside the loaders measured before it, unchanged, so their networks stay
cached and nothing but the new loader runs. The server's RssAnon is sampled every 5 ms from outside: its peak while the loader
runs and what stays after, less what the idle server held, are the loader's cost. The test
fails where a figure leaves the table's by more than 15 % (or 64 MiB, where that is more).

The files: make_big_model.py 9 (an SD3-shaped MMDiT of ~430 MB in float32, the dtype every
core keeps on a CPU) and, with FERRY_COMFYUI_GGUF, make_gguf_models.py --big 24 (a Q8_0 Wan
of ~435 MB). Each row is printed as the docs keep it (``-s``):

    FERRY_COMFYUI=/work/comfy/v0.33.0 FERRY_COMFYUI_GGUF=/work/comfy/ComfyUI-GGUF \\
        python -m pytest tests/comfyui/test_comfyui_loader_costs.py -s -p no:cacheprovider
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import comfy_checkout, make_base, run_maker, start_server, stop_server
from ferry_workflows import Client, error_message

from offload_core.planner.loader_costs import LoaderCost, loader_cost

MIB = 1 << 20
DEPTH = 9
BIG_SD3 = "ferry-big-sd3.safetensors"
GGUF_LAYERS = 24
BIG_GGUF = "ferry-big-wan-q8_0.gguf"
GGUF_PACK = os.environ.get("FERRY_COMFYUI_GGUF")

#: Each loader measured: its inputs (the network held by FerryTestHold's ``model`` input).
LOADERS: dict[str, tuple[str, dict[str, Any]]] = {
    "UNETLoader": (BIG_SD3, {"unet_name": BIG_SD3, "weight_dtype": "default"}),
    "FerryLoadDiffusionModelQuantized": (
        BIG_SD3,
        {"unet_name": BIG_SD3, "quant_preset": "none", "cache": True, "weight_dtype": "default"},
    ),
    "UnetLoaderGGUF": (BIG_GGUF, {"unet_name": BIG_GGUF}),
}


def core_version() -> str:
    comfy, _ = comfy_checkout()
    text = (comfy / "comfyui_version.py").read_text()
    found = re.search(r'__version__\s*=\s*"([^"]+)"', text)
    assert found, f"no __version__ in {comfy / 'comfyui_version.py'}"
    return found.group(1)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-loader-costs")
    make_base(base, py, comfy)
    run_maker(base, py, comfy, "make_big_model.py", str(DEPTH))
    if GGUF_PACK:
        link = base / "custom_nodes" / "ComfyUI-GGUF"
        link.symlink_to(Path(GGUF_PACK).resolve(), target_is_directory=True)
        run_maker(base, py, comfy, "make_gguf_models.py", "--big", str(GGUF_LAYERS), timeout=900)
    return base


def rss_anon(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(text.split("RssAnon:")[1].split()[0]) * 1024


class Sampler:
    """A process's RssAnon every 5 ms on a thread; ``peak`` its highest."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, rss_anon(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            try:
                self.peak = max(self.peak, rss_anon(self.pid))
            except (OSError, IndexError):
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


@pytest.fixture(scope="module")
def server(base: Path) -> Iterator[Any]:
    """One server for every loader (each start takes minutes on a busy machine)."""
    comfy, py = comfy_checkout()
    srv = start_server(comfy, py, base)
    try:
        yield srv
    finally:
        stop_server(srv)


#: The prompt so far: each loader measured stays in it, with its hold node, so ComfyUI's cache
#: keeps its network (unchanged nodes are not run again, nor their outputs dropped) and the
#: next loader's figures are its own.
PROMPT: dict[str, Any] = {}


def measure(base: Path, srv: Any, loader: str) -> tuple[LoaderCost, int]:
    """The loader's cost on this core, and its file's size."""
    file, inputs = LOADERS[loader]
    size = (base / "models" / "diffusion_models" / file).stat().st_size
    client = Client(srv.url)
    time.sleep(2.0)  # the server settles after its first answer, or the last prompt
    idle = rss_anon(srv.proc.pid)
    n = len(PROMPT)
    PROMPT[str(n + 1)] = {"class_type": loader, "inputs": inputs}
    PROMPT[str(n + 2)] = {"class_type": "FerryTestHold", "inputs": {"model": [str(n + 1), 0]}}
    sampler = Sampler(srv.proc.pid)
    entry = client.run(PROMPT)
    peak = sampler.stop()
    assert entry["status"]["status_str"] == "success", f"{error_message(entry)}\n{srv.log_tail()}"
    time.sleep(1.0)
    after = rss_anon(srv.proc.pid)
    mapped = after - idle < size / 2
    return LoaderCost(mapped, (peak - idle) / size, (after - idle) / size), size


def within(measured: float, table: float, size: int) -> bool:
    """15 % of the table's bytes, or 64 MiB where that is more."""
    return abs(measured - table) * size <= max(0.15 * table * size, 64 * MIB)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_a_loaders_ram_is_the_tables(base: Path, server: Any, loader: str) -> None:
    if loader == "UnetLoaderGGUF" and not GGUF_PACK:
        pytest.skip("set FERRY_COMFYUI_GGUF to a ComfyUI-GGUF checkout to measure its loader")
    version = core_version()
    got, size = measure(base, server, loader)
    table = loader_cost(loader, version)
    print(
        f"| {version} | {loader} | {size / MIB:.0f} MiB | "
        f"{'mapped' if got.mapped else 'copied'} | peak {got.peak:.2f}x | held {got.held:.2f}x | "
        f"table: {table}"
    )
    assert table is not None, f"{loader} on {version}: no row; measured {got}"
    assert got.mapped == table.mapped, (got, table)
    assert within(got.peak, table.peak, size), (got, table)
    assert within(got.held, table.held, size), (got, table)
