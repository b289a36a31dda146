"""Presets: stable names, where each runs, the error for one that cannot, lazy torchao."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from offload_core.errors import ConfigError
from offload_core.quant import (
    PRESETS,
    load_quantized,
    presets_for_device,
    quantize_model,
    resolve_preset,
)

REPO = Path(__file__).resolve().parents[1]
CPU_PRESETS = ["none", "int8-weight", "int8-dynamic", "float8-weight"]
GPU_ONLY = ["int4-weight", "float8-dynamic"]


def test_stable_names_and_cpu_list() -> None:
    assert list(PRESETS) == CPU_PRESETS + GPU_ONLY
    assert presets_for_device("cpu") == CPU_PRESETS
    assert presets_for_device(torch.device("cpu")) == CPU_PRESETS


@pytest.mark.parametrize("name", GPU_ONLY)
def test_gpu_only_preset_on_cpu_names_the_ones_that_run(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_preset(name, "cpu")
    assert info.value.setting == "quant_preset"
    message = str(info.value)
    assert name in message and "cuda only" in message
    for ok in CPU_PRESETS:
        assert ok in message


def test_unknown_preset_lists_all() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_preset("int3", "cpu")
    assert info.value.setting == "quant_preset"
    assert all(name in str(info.value) for name in PRESETS)


def test_wrong_preset_fails_before_any_work(tmp_path: Path) -> None:
    calls: list[torch.device] = []

    def build(device: torch.device) -> nn.Module:
        calls.append(device)
        return nn.Linear(4, 4)

    # The checkpoint does not even exist: the preset is checked first, nothing is built.
    with pytest.raises(ConfigError) as info:
        load_quantized(tmp_path / "missing.safetensors", build, "float8-dynamic")
    assert info.value.setting == "quant_preset"
    assert calls == []
    model = nn.Linear(256, 256)
    before = model.weight.detach().clone()
    with pytest.raises(ConfigError):
        quantize_model(model, "int4-weight")
    assert type(model.weight) is nn.Parameter and torch.equal(model.weight, before)


@pytest.mark.parametrize(
    ("name", "config", "tensor"),
    [
        ("int8-weight", "Int8WeightOnlyConfig", "Int8Tensor"),
        ("int8-dynamic", "Int8DynamicActivationInt8WeightConfig", "Int8Tensor"),
        ("float8-weight", "Float8WeightOnlyConfig", "Float8Tensor"),
    ],
)
def test_cpu_presets_make_their_torchao_config(name: str, config: str, tensor: str) -> None:
    assert type(PRESETS[name].make_config()).__name__ == config
    model = nn.Sequential(nn.ModuleList([nn.Linear(256, 256)]))
    report = quantize_model(model, name)
    assert type(model[0][0].weight).__name__ == tensor
    assert [r.quantized for r in report.layers] == [True]


def test_none_preset_changes_nothing() -> None:
    model = nn.Sequential(nn.ModuleList([nn.Linear(256, 256)]))
    weight = model[0][0].weight
    report = quantize_model(model, "none")
    assert model[0][0].weight is weight
    assert report.layers[0].reason == "preset none"
    assert report.bytes_before == report.bytes_after


def test_import_is_lazy_and_quiet() -> None:
    """Importing the loader imports neither torchao (slow, optional) nor ComfyUI/Gradio,
    starts no thread and leaves CUDA alone."""
    code = (
        "import sys, threading, torch\n"
        "import offload_core.quant as q\n"
        "assert q.presets_for_device('cpu')\n"
        "bad = [m for m in ('torchao', 'comfy', 'gradio') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
        "assert not torch.cuda.is_initialized()\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_cli_lists_presets_and_refuses_a_gpu_preset(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "offload_core.quant"]
    out = subprocess.run([*run, "presets"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines()}
    assert set(lines) == set(PRESETS)
    assert "[runs here]" in lines["int8-weight"] and "not here" in lines["int4-weight"]
    bad = subprocess.run(
        [*run, "load", str(tmp_path / "x.safetensors"), "--preset", "int4-weight"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert "quant_preset" in bad.stderr and "int8-weight" in bad.stderr


def test_cli_loads_a_demo_checkpoint_through_the_cache(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from offload_core.model.demo import build_demo_model

    ckpt = tmp_path / "demo.safetensors"
    save_file(build_demo_model(size_gb=0.0015, dtype=torch.bfloat16).state_dict(), str(ckpt))
    run = [sys.executable, "-m", "offload_core.quant", "load", str(ckpt), "--preset", "int8-weight"]
    run += ["--cache-dir", str(tmp_path / "cache"), "--skip", "single_blocks.*"]
    lines = []
    for _ in range(2):
        out = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        lines.append(out.stdout.splitlines())
    assert "cache miss" in lines[0][0] and "cache hit" in lines[1][0]
    assert lines[0][0].startswith("int8-weight on cpu: ")
    assert lines[1][1].startswith(f"cache: {tmp_path / 'cache'}")
