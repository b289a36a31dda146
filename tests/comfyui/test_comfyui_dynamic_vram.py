"""Ferry on what ComfyUI >= 0.15 turns on by default on NVIDIA (issue 19), in real ComfyUI on
this CPU machine: a second server runs with ferry_standin_nodes.py switched on, a CPU STAND-IN
for comfy-aimdo (``aimdo``: aimdo_enabled, a dynamic patcher class, core's cached delegate,
aimdo's file mapping) and for the LoRA dtype of most NVIDIA cards (``lora-fp16``). Every latent
is compared bit for bit with the one ComfyUI makes without Ferry (and without the stand-in,
except for LoRA, whose reference is the stand-in server's own). What the stand-in cannot show
(aimdo's VRAM paging, pinned host buffers, --fast-disk) is listed in ferry_standin_nodes.py.

Each test names the issue's finding it covers. ``aimdo`` tests need a core with dynamic VRAM
(v0.15+: ComfyUI v0.33 here); ``lora-fp16`` needs ``lora_compute_dtype`` (v0.4+).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import (
    HAS_AIMDO,
    Server,
    comfy_checkout,
    core_has,
    make_base,
    start_server,
    stop_server,
)
from ferry_workflows import MODEL_FILE, Client, error_message, ferry, graph, lora
from test_comfyui_real import latent, live, run_ok

HAS_LORA_DTYPE = core_has("comfy/model_management.py", "LORA_COMPUTE_DTYPES")
HAS_RAM_CACHE = core_has("comfy/memory_management.py", "RAM_CACHE_HEADROOM")
HAS_COMFY_QUANT = core_has("comfy/quant_ops.py", "QuantizedTensor")
SWITCHES = ",".join(s for s, on in (("aimdo", HAS_AIMDO), ("lora-fp16", HAS_LORA_DTYPE)) if on)
aimdo = pytest.mark.skipif(not HAS_AIMDO, reason="this core has no dynamic VRAM (v0.15+)")
lora16 = pytest.mark.skipif(not HAS_LORA_DTYPE, reason="this core has no lora_compute_dtype")
_seeds = itertools.count(300)


@pytest.fixture(scope="module")
def plain(server: Server) -> Client:
    return Client(server.url)


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not SWITCHES:
        pytest.skip("this core has neither dynamic VRAM nor lora_compute_dtype to stand in for")
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-standin")
    make_base(base, py, comfy)
    srv = start_server(comfy, py, base, standin=SWITCHES)
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def refs(plain: Client, server: Server) -> dict[Any, torch.Tensor]:
    return {}


def ref(plain: Client, server: Server, refs: dict[Any, torch.Tensor], seed: int = 7, **kw: Any):  # type: ignore[no-untyped-def]
    """The latent UNETLoader (or ``loader``) -> KSampler makes on the plain server."""
    key = (seed, repr(sorted(kw.items())))
    if key not in refs:
        refs[key] = run_ok(plain, server, graph([], f"ref-{seed}", seed=seed, **kw))
    return refs[key]


def loads(srv: Server) -> dict[str, Any]:
    return Client(srv.url).get("/ferry_test/loads")


def said(srv: Server, text: str) -> int:
    return srv.log.read_text(errors="replace").count(text)


def ferry_loader(name: str = MODEL_FILE, preset: str = "none", **kw: Any) -> tuple[str, dict]:
    inputs = {"unet_name": name, "quant_preset": preset, "cache": kw.pop("cache", False), **kw}
    return ("FerryLoadDiffusionModelQuantized", inputs)


def unet(name: str = MODEL_FILE, weight_dtype: str = "default") -> tuple[str, dict]:
    return ("UNETLoader", {"unet_name": name, "weight_dtype": weight_dtype})


def test_the_standin_turns_on_what_aimdo_turns_on(standin: Server, plain, server, refs) -> None:  # type: ignore[no-untyped-def]
    state = loads(standin)
    assert state["switches"] == SWITCHES.split(",")
    if HAS_AIMDO:
        assert state["aimdo_enabled"] and state["core_patcher"] == "StandInDynamicPatcher"
    # Core's own path through the stand-in (lazy Linears, the mapped file, the dynamic patcher)
    # gives ComfyUI's plain latent: the stand-in changes where weights come from, not values.
    assert torch.equal(
        run_ok(Client(standin.url), standin, graph([], "core")), ref(plain, server, refs)
    )


@aimdo
@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_finding1_ferry_loader_fills_the_layers_core_builds_without_weights(
    standin: Server, plain: Client, server: Server, refs: dict, tier: str
) -> None:
    g = graph([ferry(tier=tier)], f"f1-{tier}", loader=ferry_loader())
    assert torch.equal(run_ok(Client(standin.url), standin, g), ref(plain, server, refs))


@aimdo
def test_finding2_one_delegate_per_dynamic_model_keeps_its_layout(
    standin: Server, plain: Client, server: Server, refs: dict
) -> None:
    c = Client(standin.url)
    before = loads(standin)
    for depth in (1, 2, 1):  # the Ferry node runs again each time (a widget changed)
        g = graph([ferry(tier="ram", prefetch_depth=depth)], f"f2-{depth}")
        assert torch.equal(run_ok(c, standin, g), ref(plain, server, refs))
    after = loads(standin)
    # UNETLoader's dynamic model at most once, its plain delegate exactly once: the file is
    # not read again (nor held twice in RAM) each time the Ferry node runs.
    assert after["dynamic"] - before["dynamic"] <= 1 and after["plain"] - before["plain"] == 1
    # The same config again through a node that runs again (the panel's settings file was
    # saved anew, unchanged): the layout is kept, nothing is read.
    settings = {"policy": {"tier": "ram", "level": "block", "prefetch_depth": 1}}
    assert c.post("/ferry/settings", settings)[0] == 200
    g = graph([ferry(use_panel_settings=True)], "f2-panel", seed=next(_seeds))
    run_ok(c, standin, g)
    laid = said(standin, "ferry: laid out")
    time.sleep(0.05)  # a new mtime for the same settings
    assert c.post("/ferry/settings", settings)[0] == 200
    seed = next(_seeds)
    got = run_ok(c, standin, graph([ferry(use_panel_settings=True)], "f2-panel", seed=seed))
    assert torch.equal(got, ref(plain, server, refs, seed))
    assert said(standin, "ferry: laid out") == laid
    assert loads(standin)["plain"] == after["plain"]


@aimdo
def test_finding3_the_quantized_loaders_fallback_stays_quantized(
    standin: Server, plain: Client, server: Server
) -> None:
    # A file under "model.diffusion_model." takes the loader's fallback: ComfyUI's loader, then
    # quantized in place. Ferry after it must run the quantized model, not reload the file.
    q = ferry_loader("ferry-tiny-sd3-prefixed.safetensors", "int8-weight", cache=True)
    quantized = run_ok(plain, server, graph([], "f3-ref", loader=q))
    c = Client(standin.url)
    before = loads(standin)
    assert torch.equal(run_ok(c, standin, graph([], "f3", loader=q)), quantized)
    got = run_ok(c, standin, graph([ferry(tier="ram")], "f3-ferry", loader=q))
    assert torch.equal(got, quantized)
    after = loads(standin)
    assert after["dynamic"] == before["dynamic"] and after["plain"] - before["plain"] == 1


@aimdo
def test_finding4_unetloaders_weight_dtype_survives_the_delegate(
    standin: Server, plain: Client, server: Server, refs: dict
) -> None:
    want = ref(plain, server, refs, loader=unet(weight_dtype="fp8_e4m3fn"))
    assert not torch.equal(want, ref(plain, server, refs))  # fp8 does change the latent
    g = graph([ferry(tier="ram")], "f4", loader=unet(weight_dtype="fp8_e4m3fn"))
    assert torch.equal(run_ok(Client(standin.url), standin, g), want)


QUANT_FILES = ["ferry-tiny-sd3-fp8scaled.safetensors"]
if HAS_COMFY_QUANT:
    QUANT_FILES.append("ferry-tiny-sd3-comfyquant.safetensors")


@pytest.mark.parametrize("name", QUANT_FILES)
def test_finding4_cores_quantized_formats_load_through_core(
    plain: Client, server: Server, refs: dict, name: str, request: pytest.FixtureRequest
) -> None:
    want = ref(plain, server, refs, loader=unet(name))
    assert not torch.equal(want, ref(plain, server, refs))
    # A torchao preset on a file core has quantized already: said before any work.
    q = graph([], "f4q-preset", loader=ferry_loader(name, "int8-weight", cache=True))
    entry = plain.run(q)
    assert entry["status"]["status_str"] == "error"
    fmt = "fp8_scaled" if "fp8scaled" in name else "comfy_quant"
    assert "quant_preset: " in error_message(entry), error_message(entry)
    assert f"already quantized (ComfyUI's {fmt} format)" in error_message(entry)
    servers = [server]
    if HAS_AIMDO:
        servers.append(request.getfixturevalue("standin"))
    for srv in servers:
        c = Client(srv.url)
        for tier in ("ram", "disk"):
            g = graph([ferry(tier=tier)], f"f4q-{tier}", loader=ferry_loader(name))
            assert torch.equal(run_ok(c, srv, g), want), (srv.url, tier)
        assert said(srv, "format) stays in its file") >= 1  # streamed (issue 40)
        assert said(srv, "needs ComfyUI's own conversion") == 0
        # Nothing Ferry asks of core warns (v0.33: config.scaled_fp8 is gone; string_to_seed
        # moved to comfy.utils).
        assert said(srv, "you accessed scaled_fp8") == 0
        assert said(srv, "string_to_seed has moved") == 0


@lora16
def test_finding5_lora_after_ferry_computes_in_cores_lora_dtype(
    standin: Server, plain: Client, server: Server
) -> None:
    c = Client(standin.url)
    want = run_ok(c, standin, graph([lora()], "f5-ref"))  # UNETLoader -> LoRA, fp16 LoRA maths
    assert not torch.equal(want, run_ok(plain, server, graph([lora()], "f5-fp32")))
    for name, loader, tier in (
        ("lazy-disk", ferry_loader(), "disk"),
        ("lazy-ram", ferry_loader(), "ram"),
        ("unet-ram", None, "ram"),
    ):
        g = graph([ferry(tier=tier), lora()], f"f5-{name}", loader=loader)
        assert torch.equal(run_ok(c, standin, g), want), name
    assert said(standin, "string_to_seed has moved") == 0


@aimdo
def test_a_model_core_cannot_reload_is_left_to_core_and_said_once(
    standin: Server, plain: Client, server: Server, refs: dict
) -> None:
    c = Client(standin.url)
    loader = ("FerryTestLoaderWithoutReload", {"unet_name": MODEL_FILE})
    c.unload_models(within_s=10)
    before = said(standin, "--disable-dynamic-vram")
    tracebacks = said(standin, "Traceback")
    for seed in (next(_seeds), next(_seeds)):
        entry = c.run(graph([ferry(tier="disk")], "no-reload", loader=loader, seed=seed))
        assert entry["status"]["status_str"] == "success", error_message(entry)
        assert torch.equal(latent(standin, entry), ref(plain, server, refs, seed))
        assert live(c) == []  # ComfyUI's dynamic VRAM runs it, not Ferry
    assert said(standin, "--disable-dynamic-vram") - before == 1
    assert said(standin, "Traceback") == tracebacks


@pytest.mark.skipif(not HAS_RAM_CACHE, reason="this core has no RAM-pressure cache")
def test_finding6_ram_pressure_cache_dropping_the_model_is_said_once(
    tmp_path_factory: pytest.TempPathFactory, plain: Client, server: Server, refs: dict
) -> None:
    # A headroom above this machine's RAM: ComfyUI's default cache then drops every cached
    # output after each node, as it does when a big model fills RAM.
    comfy, py = comfy_checkout()
    base = tmp_path_factory.mktemp("comfy-ramcache")
    make_base(base, py, comfy)
    srv = start_server(comfy, py, base, args=("--cache-ram", "100000"))
    try:
        c = Client(srv.url)
        for seed in (next(_seeds), next(_seeds)):
            got = run_ok(c, srv, graph([ferry(tier="ram")], "f6", seed=seed))
            assert torch.equal(got, ref(plain, server, refs, seed))
        assert said(srv, "ferry: laid out") >= 2  # the cache dropped the model in between
        assert said(srv, "--cache-ram") >= 1
        assert said(srv, "RAM-pressure cache (its default)") == 1
    finally:
        stop_server(srv)
