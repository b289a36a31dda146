"""Each stored format's size as the host holds it, from the header alone
(offload_core/planner/stored_sizes.py): real small files in each format's layout (fp8_scaled,
comfy_quant fp8 / MXFP8 / NVFP4, GGUF Q8_0 and K-quants, a torchao preset on a bf16 file),
planned as a CPU (float32) and a bf16 GPU host load them. Each test also states what the old
rule (every floating tensor in the compute dtype) gave, so it fails with that rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from offload_core.formats.safetensors import read_checkpoint_header
from offload_core.planner import MachineFacts, NetworkFacts, plan_graph
from offload_core.planner.network_file import network_from_file
from offload_core.planner.network_module import network_from_module
from offload_core.planner.stored_sizes import (
    MIN_WEIGHT_NUMEL,
    PRESET_BYTES,
    SKIP_PATTERNS,
)
from offload_core.units import GIB

from .planner_files import bytes_read, sparse_safetensors

WIDTH = 256
BLOCKS = 4


def dit(width: int = WIDTH, blocks: int = BLOCKS) -> dict[str, torch.Tensor]:
    """A Wan-shaped network: an input projection, blocks of attention and a 2x feed-forward
    (bf16 Linears, float32 norms), an output head."""
    g = torch.Generator().manual_seed(0)

    def w(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(dtype)

    sd = {"patch_embedding.weight": w(width, 64), "patch_embedding.bias": w(width)}
    for i in range(blocks):
        b = f"blocks.{i}."
        for name in ("self_attn.q", "self_attn.o"):
            sd[b + name + ".weight"], sd[b + name + ".bias"] = w(width, width), w(width)
        sd[b + "ffn.0.weight"], sd[b + "ffn.0.bias"] = w(2 * width, width), w(2 * width)
        sd[b + "ffn.2.weight"], sd[b + "ffn.2.bias"] = w(width, 2 * width), w(width)
        sd[b + "norm3.weight"] = w(width, dtype=torch.float32)
    sd["head.head.weight"] = w(64, width)
    return sd


def linears(sd: dict[str, torch.Tensor]) -> list[str]:
    return [k[: -len(".weight")] for k, v in sd.items() if k.endswith(".weight") and v.dim() == 2]


def fp8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (t.float().abs().max() / 448.0).clamp(min=1e-12)
    return (t.float() / scale).to(torch.float8_e4m3fn), scale.reshape(())


def fp8_scaled(sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Comfy-Org's ``*_fp8_scaled`` layout (tests/comfyui/make_quant_models.py): every Linear
    fp8 with its ``scale_weight`` and the ``scaled_fp8`` marker."""
    out = dict(sd)
    for layer in linears(sd):
        out[layer + ".weight"], out[layer + ".scale_weight"] = fp8(sd[layer + ".weight"])
    out["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return out, {}


def config(fmt: str) -> torch.Tensor:
    return torch.tensor(list(json.dumps({"format": fmt}).encode()), dtype=torch.uint8)


def comfy_fp8(sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The ``fp8mixed`` layout: every other Linear of the blocks fp8 with ``weight_scale`` and
    a ``comfy_quant`` config, the rest bf16."""
    out = dict(sd)
    for layer in [x for x in linears(sd) if x.startswith("blocks.")][::2]:
        out[layer + ".weight"], out[layer + ".weight_scale"] = fp8(sd[layer + ".weight"])
        out[layer + ".comfy_quant"] = config("float8_e4m3fn")
    return out, {}


def comfy_mxfp8(sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """MXFP8: fp8 data and an e8m0 scale per 32 values, the configs in the header's
    ``_quantization_metadata`` (core's TensorCoreMXFP8Layout)."""
    out, layers = dict(sd), {}
    for layer in [x for x in linears(sd) if x.startswith("blocks.")]:
        w = sd[layer + ".weight"]
        out[layer + ".weight"] = fp8(w)[0]
        out[layer + ".weight_scale"] = torch.ones(w.shape[0], w.shape[1] // 32).to(
            torch.float8_e8m0fnu
        )
        layers[layer] = {"format": "mxfp8"}
    return out, {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})}


def comfy_nvfp4(sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """NVFP4: two 4-bit values a byte (uint8), an fp8 scale per 16 values and a float32
    tensor scale (core's TensorCoreNVFP4Layout), a ``comfy_quant`` config each."""
    out = dict(sd)
    for layer in [x for x in linears(sd) if x.startswith("blocks.")]:
        o, i = sd[layer + ".weight"].shape
        out[layer + ".weight"] = torch.randint(0, 255, (o, i // 2), dtype=torch.uint8)
        out[layer + ".weight_scale"] = torch.ones(o, i // 16).to(torch.float8_e4m3fn)
        out[layer + ".weight_scale_2"] = torch.tensor(1.0)
        out[layer + ".input_scale"] = torch.tensor(1.0)
        out[layer + ".comfy_quant"] = config("nvfp4")
    return out, {}


def save(path: Path, made: tuple[dict[str, torch.Tensor], dict[str, str]]) -> Path:
    save_file({k: v.contiguous() for k, v in made[0].items()}, str(path), metadata=made[1])
    return path


def old_rule(path: Path, cast: torch.dtype) -> int:
    """What the planner gave before: every floating tensor in ``cast``, the rest as stored."""
    return sum(
        t.nbytes // t.dtype.itemsize * cast.itemsize if t.dtype.is_floating_point else t.nbytes
        for t in read_checkpoint_header(path).entries.values()
    )


def expected(path: Path, quantized: set[str], cast: torch.dtype) -> int:
    """The host's: a quantized layer's tensors (not its bias) and the marker as stored, every
    other floating tensor in ``cast``."""
    total = 0
    for key, t in read_checkpoint_header(path).entries.items():
        layer, _, leaf = key.rpartition(".")
        kept = (layer in quantized and leaf != "bias") or key == "scaled_fp8"
        floating = t.dtype.is_floating_point and not kept
        total += t.nbytes // t.dtype.itemsize * cast.itemsize if floating else t.nbytes
    return total


MAKERS = {
    "fp8_scaled": fp8_scaled,
    "comfy_quant-fp8": comfy_fp8,
    "comfy_quant-mxfp8": comfy_mxfp8,
    "comfy_quant-nvfp4": comfy_nvfp4,
}


@pytest.mark.parametrize("cast", [torch.float32, torch.bfloat16], ids=["cpu-fp32", "gpu-bf16"])
@pytest.mark.parametrize("fmt", list(MAKERS))
def test_core_quant_formats_are_planned_as_stored(
    tmp_path: Path, fmt: str, cast: torch.dtype
) -> None:
    sd = dit()
    made = MAKERS[fmt](sd)
    path = save(tmp_path / f"{fmt}.safetensors", made)
    quantized = {k.rpartition(".")[0] for k in made[0] if k.endswith(("_scale", "scale_weight"))}
    net = network_from_file(path, name="wan", kind="model", cast=cast)
    assert net.nbytes == expected(path, quantized, cast)
    if fmt != "comfy_quant-fp8" or cast == torch.float32:  # bf16 layers under bf16: no change
        assert net.nbytes < old_rule(path, cast)
    assert sum(net.block_bytes) < net.nbytes and len(net.block_bytes) == BLOCKS
    assert not net.in_place  # its float32 norms are cast either way


def test_a_quantized_file_a_host_holds_as_stored_is_read_in_place(tmp_path: Path) -> None:
    """A bf16 host holds an fp8_scaled file with bf16 plain tensors as stored: the disk tier
    reads its groups from the file (before, its fp8 "cast" to bf16 made it write them all)."""
    sd = {k: v.to(torch.bfloat16) for k, v in dit().items()}
    path = save(tmp_path / "s.safetensors", fp8_scaled(sd))
    assert network_from_file(path, name="wan", kind="model", cast=torch.bfloat16).in_place
    assert not network_from_file(path, name="wan", kind="model", cast=torch.float32).in_place


def test_a_cast_rule_is_asked_about_the_plain_floats(tmp_path: Path) -> None:
    """Core's rule (unet_dtype) is given the dtype of the file's plain floats, not the fp8 of
    its quantized layers (core sets weight_dtype to None for a quantized file)."""
    path = save(tmp_path / "s.safetensors", fp8_scaled(dit()))
    asked: list[torch.dtype] = []

    def rule(stored: torch.dtype, params: int) -> torch.dtype:
        asked.append(stored)
        return torch.float32

    ruled = network_from_file(path, name="wan", kind="model", cast=rule)
    assert asked == [torch.bfloat16]
    assert (
        ruled.nbytes == network_from_file(path, name="wan", kind="model", cast=torch.float32).nbytes
    )


def test_a_plain_fp8_file_follows_the_hosts_rule_and_a_wider_cast_keeps_it(
    tmp_path: Path,
) -> None:
    """A plain fp8 file (no scales): core's own rule may widen it (it has room), a fixed
    compute dtype keeps fp8 storage (cast per use)."""
    sd = {k: (v.to(torch.float8_e4m3fn) if v.dim() == 2 else v) for k, v in dit().items()}
    path = save(tmp_path / "plain-fp8.safetensors", (sd, {}))
    fixed = network_from_file(path, name="m", kind="model", cast=torch.float32)
    assert fixed.nbytes < old_rule(path, torch.float32)
    fp8_bytes = sum(v.nbytes for v in sd.values() if v.dtype == torch.float8_e4m3fn)
    assert fixed.nbytes == fp8_bytes + sum(v.numel() * 4 for v in sd.values() if v.dim() != 2)
    widened = network_from_file(path, name="m", kind="model", cast=lambda d, n: torch.float32)
    assert widened.nbytes == old_rule(path, torch.float32) and not widened.in_place


def test_a_host_without_comfy_quant_loads_such_a_file_as_plain_floats(tmp_path: Path) -> None:
    """ComfyUI v0.3.64 has no comfy_quant: it builds plain layers in its dtype and copies
    the file's fp8 weights into them (measured: tests/comfyui's core check in the report)."""
    path = save(tmp_path / "mixed.safetensors", comfy_fp8(dit()))
    ruled = network_from_file(
        path, name="m", kind="model", cast=lambda d, n: torch.bfloat16, keeps=("fp8_scaled",)
    )
    assert ruled.nbytes == old_rule(path, torch.bfloat16) and not ruled.in_place
    kept = network_from_file(path, name="m", kind="model", cast=lambda d, n: torch.bfloat16)
    assert kept.nbytes < ruled.nbytes


@pytest.mark.parametrize("mix", ["q8_0", "k"])
def test_gguf_is_planned_as_stored(tmp_path: Path, mix: str) -> None:
    from tests.gguf_standin import WIDTH as GW
    from tests.gguf_standin import write_gguf

    path = write_gguf(tmp_path / f"m-{mix}.gguf", mix)
    stored = sum(t.nbytes for t in read_checkpoint_header(path).entries.values())
    olds = []
    for cast in (torch.float32, torch.bfloat16):
        net = network_from_file(path, name="g", kind="model", cast=cast)
        assert net.nbytes == stored and net.in_place
        # The largest quantized weight dequantized in the compute dtype.
        assert net.transient_bytes == GW * GW * cast.itemsize
        olds.append(old_rule(path, cast))
    assert any(old != stored for old in olds)  # the old cast widened F16 or narrowed F32
    # Core's rule, asked about a file whose tensors it keeps, still names the compute dtype.
    ruled = network_from_file(path, name="g", kind="model", cast=lambda d, n: torch.bfloat16)
    assert ruled.nbytes == stored and ruled.transient_bytes == GW * GW * 2


def test_a_torchao_preset_counts_its_stored_bytes(tmp_path: Path) -> None:
    sd = dit()
    path = save(tmp_path / "bf16.safetensors", (sd, {}))
    none = network_from_file(path, name="m", kind="model", cast=torch.float32, preset="none")
    assert none.nbytes == old_rule(path, torch.float32) and none.transient_bytes == 0
    net = network_from_file(path, name="m", kind="model", cast=torch.float32, preset="int8-weight")
    taken = [k for k, v in sd.items() if k.startswith("blocks.") and v.dim() == 2]
    want = sum(
        v.shape[0] * v.shape[1] + 5 * v.shape[0] if k in taken else v.numel() * 4
        for k, v in sd.items()
    )
    assert net.nbytes == want < none.nbytes and not net.in_place
    assert net.transient_bytes == 2 * WIDTH * WIDTH * 4  # ffn.0 dequantized to float32


def test_the_preset_figures_are_torchaos_and_quants(tmp_path: Path) -> None:
    """The planner keeps its own copy of the presets' figures (it sits beside quant/): held
    to quant/'s presets and selection defaults, and to torchao's bytes where it runs here."""
    pytest.importorskip("torchao")
    from torchao.quantization import quantize_

    from offload_core.model.layout import tensor_nbytes
    from offload_core.quant.presets import PRESETS
    from offload_core.quant.selection import DEFAULT_MIN_WEIGHT_NUMEL, DEFAULT_SKIP_PATTERNS

    assert set(PRESET_BYTES) == {n for n, p in PRESETS.items() if p.quantizes}
    assert all(PRESET_BYTES[n][1] == PRESETS[n].in_features_multiple for n in PRESET_BYTES)
    assert (SKIP_PATTERNS, MIN_WEIGHT_NUMEL) == (DEFAULT_SKIP_PATTERNS, DEFAULT_MIN_WEIGHT_NUMEL)
    for name in ("int8-weight", "int8-dynamic", "float8-weight"):
        for dtype in (torch.bfloat16, torch.float32):
            m = torch.nn.Sequential(torch.nn.Linear(512, 256)).to(dtype)
            quantize_(m, PRESETS[name].make_config())
            assert tensor_nbytes(m[0].weight) == PRESET_BYTES[name][0](256, 512), (name, dtype)


def test_a_network_in_memory_counts_its_quantized_tensors_as_held() -> None:
    """network_module: a torchao-quantized network's held bytes are its inner tensors'
    (``Tensor.nbytes`` counts a wrapper in its outer dtype: 4x an int8 weight)."""
    pytest.importorskip("torchao")
    from torchao.quantization import quantize_

    from offload_core.model.layout import module_nbytes
    from offload_core.quant.presets import PRESETS

    net = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(256, 512)) for _ in range(3)))
    quantize_(net, PRESETS["int8-weight"].make_config())
    facts = network_from_module(net, "q", "model")
    assert facts.nbytes == facts.held_bytes == module_nbytes(net)
    assert facts.held_bytes < sum(p.nbytes for p in net.parameters())  # the old count
    assert facts.transient_bytes == 512 * 256 * 4  # one layer dequantized, float32


def test_the_transient_is_the_largest_layer_and_the_plan_counts_it(tmp_path: Path) -> None:
    path = save(tmp_path / "s.safetensors", fp8_scaled(dit()))
    net = network_from_file(path, name="wan", kind="model", cast=torch.float32)
    assert net.transient_bytes == 2 * WIDTH * WIDTH * 4  # ffn.0 in float32
    bf16 = network_from_file(path, name="wan", kind="model", cast=torch.bfloat16)
    assert bf16.transient_bytes == 2 * WIDTH * WIDTH * 2
    # Planned: RAM on a CPU (the onload device), VRAM on a GPU, beside the slots.
    big = NetworkFacts("m", "model", 8 * GIB, (GIB // 2,) * 16, reads_per_prompt=20)
    with_copy = NetworkFacts(**{**big.__dict__, "transient_bytes": GIB})
    cpu = MachineFacts(vram_free=None, ram_available=64 * GIB, disk_free=None)
    a, b = plan_graph(cpu, [big]).choices[0], plan_graph(cpu, [with_copy]).choices[0]
    assert b.ram_bytes - a.ram_bytes == GIB
    gpu = MachineFacts(vram_free=4 * GIB, ram_available=64 * GIB, pin_limit=None)
    pa, pb = plan_graph(gpu, [big]), plan_graph(gpu, [with_copy])
    assert pa.peak_vram is not None and pb.peak_vram is not None
    assert pb.peak_vram <= 4 * GIB - 2 * GIB + GIB  # still inside the room after headroom
    assert pb.choices[0].vram_resident < pa.choices[0].vram_resident  # the copy takes room


def test_a_quantized_file_is_sized_from_its_header_alone(tmp_path: Path) -> None:
    """40 fp8_scaled blocks of 8192-wide Linears (5 GiB declared, a hole on disk)."""
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {"scaled_fp8": ("F8_E4M3", (0,))}
    for i in range(40):
        for name in ("mlp.0", "mlp.2"):
            tensors[f"blocks.{i}.{name}.weight"] = ("F8_E4M3", (4 * 8192, 8192))
            tensors[f"blocks.{i}.{name}.scale_weight"] = ("F32", ())
            tensors[f"blocks.{i}.{name}.bias"] = ("BF16", (4 * 8192,))
    path = sparse_safetensors(tmp_path / "big.safetensors", tensors)
    with bytes_read() as n:
        net = network_from_file(path, name="big", kind="model", cast=torch.float32)
    assert n[0] < 64 * 1024
    block = 2 * (4 * 8192 * 8192 + 4 + 4 * 8192 * 4)
    assert net.block_bytes == (block,) * 40


def print_table(folder: Path) -> None:
    """Each test file's size on disk, planned by the old rule and by the table, as a CPU
    (float32) and a bf16 GPU host load it, and its transient on the CPU:
    ``python -m tests.test_stored_sizes``."""
    from tests.gguf_standin import write_gguf

    files = {name: save(folder / f"{name}.safetensors", mk(dit())) for name, mk in MAKERS.items()}
    for mix in ("q8_0", "k"):
        files[f"gguf-{mix}"] = write_gguf(folder / f"{mix}.gguf", mix)
    print(f"{'file':18} {'on disk':>9} | {'old fp32':>9} {'new fp32':>9} | "
          f"{'old bf16':>9} {'new bf16':>9} | transient fp32")  # fmt: skip
    for name, path in files.items():
        row = [path.stat().st_size]
        for cast in (torch.float32, torch.bfloat16):
            net = network_from_file(path, name=name, kind="model", cast=cast)
            row += [old_rule(path, cast), net.nbytes]
        cpu = network_from_file(path, name=name, kind="model", cast=torch.float32)
        transient = cpu.transient_bytes
        print(f"{name:18} {row[0]:>9} | {row[1]:>9} {row[2]:>9} | {row[3]:>9} {row[4]:>9} | "
              f"{transient}")  # fmt: skip


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        print_table(Path(d))
