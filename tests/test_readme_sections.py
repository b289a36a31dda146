"""The README a ComfyUI user meets (issue 50): its first screen has the install commands, the
one-node recipe and a picture; the two commands stay near the top and CI runs the test command
it gives; and nothing the old README said is lost.

The old README (831 lines, before issue 50) went section by section through the panel, the CLI
demo, the Python API, the platforms, ComfyUI, Forge, quantization, benchmarks and the tests.
Its detail moved to pages under docs/. ANCHOR_TERMS holds, per old ``##``/``###`` section, the
terms a reader would search for (node names, environment variables, commands, options, files):
each must still be written in the README or in a page the README leads to by its links.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO
from tests.readme_docs import README, flat, reachable_from_readme

#: The first screen: what a reader sees before scrolling, in lines of the README's source.
FIRST_SCREEN_LINES = 60
#: The two commands must come before this line.
TWO_COMMANDS_BY_LINE = 100

#: Old README section -> terms it held that must stay findable.
ANCHOR_TERMS: dict[str, tuple[str, ...]] = {
    "Ferry (the opening)": (
        "pinned RAM", "side stream", "waits on events, never on the host", "bit-identical",
        "torch.equal", "Three ways in, one engine", "web/comfyui/", "scripts/ferry_webui.py",
        "web/panel/", "seam/", "architecture.md",
    ),
    "Two commands": (
        "bash run.sh test", "Python 3.10+", "torch==2.13.0", "constraints.txt",
        "http://127.0.0.1:7860/",
    ),
    "Let Ferry choose": (
        "MAX_PINNED_MEMORY", "CheckpointLoaderSimple", "TripleCLIPLoader", "DualCLIPLoader",
        "ferry plan:", "256 MiB", "a copy worth its launch", "set tier to auto or ram",
        "choose a folder with room (disk_path)", "may not fit", "Plan this workflow",
        "POST /ferry/plan", "POST /ferry/budgets", '"vram_gb": 10', "comfyui-plan.png",
    ),
    "The panel (start here)": (
        "--listen 0.0.0.0", "--no-browser", "offload_core/units.py", "use panel settings",
        "Blocks moved together", "Save the recommended plan", "offload_core.tools.autotune",
        "FERRY_SETTINGS", "%APPDATA%", "panel.png", "planner.png",
    ),
    "The CLI demo": ("bash run.sh demo", "--size-gb", "RssShmem", "--level leaf"),
    "Using offload_core from Python": (
        "apply_offload", "plan_offload", "handle.stats()", "CompiledBlocks", "CompileSettings",
        "API.md",
    ),
    "The settings": (
        "PinnedRamTier(pin_limit=...)", "bake_lora", "source_checkpoint", 'cpu_read="mapped"',
        '"every_read"', "prefetch_depth", "transparent_hugepage", "16 MiB at a time",
        "Which CPU read path the disk tier takes",
    ),
    "How it stays correct": (
        "tests/test_stream_ordering.py", "torch.utils.swap_tensors", "64-byte aligned",
        "MADV_POPULATE_READ", "Ending.DISCARD", "ulimit -n", "WeightsLostError",
        "offload_core/disk/repair.py",
    ),
    "Platforms": (
        "RestoreIncompleteError", "tests/platform_standin.py", "bash run.sh platforms",
        "FILE_FLAG_NO_BUFFERING", "F_NOCACHE",
    ),
    "ComfyUI": (
        "comfy node install ferry", "ComfyUI-Manager", "example_workflows/",
        "Ferry Offload Model", "Ferry Offload Text Encoder", "Ferry Offload ControlNet",
        "Ferry Offload Model Patch", "Ferry Offload CLIP Vision", "Ferry Load Text Encoder",
        "Ferry Load Text Encoders (dual)", "Ferry Load Diffusion Model (quantized)",
        "Ferry Memory Report", "Ferry Compile Blocks", "TorchCompileModel", "UnetLoaderGGUF",
        "CLIPLoaderGGUF", "fp8_scaled", "comfy_quant", "get_non_dynamic_delegate",
        "--disable-dynamic-vram", "--cache-classic", "GET /ferry/stats", "ferry.stats",
        "nested over 64 levels", "FERRY_SCREENSHOTS", "FERRY_TEMPLATE_THUMBNAILS",
        "publish_action.yml", "CHANGELOG.md", "comfyui-templates.png", "comfyui-sidebar.png",
        "comfyui-help-zh.png",
    ),
    "Stable Diffusion WebUI Forge": (
        "Install from URL", "Use saved settings", "Offload the text encoder too",
        "alwayson_scripts", "GET /ferry/plan", "GPU Weights", "sd_forge_controlnet", "bnb-nf4",
        "ParameterGGUF", "AUTOMATIC1111", "tests/forge/test_forge_auto.py",
        "forge-accordion.png", "forge-tab.png",
    ),
    "Quantization (offload_core.quant)": (
        "int8-weight", "float8-dynamic", "load_quantized", "presets_for_device", "SkipRules",
        "load_offloaded", "python -m offload_core.quant presets", "bench/bench_quant.py",
        "torchao==0.18.0",
    ),
    "Benchmarks": (
        "bash bench/run.sh", "--paired", ".venv-bench", "bash tools/gpu_suite.sh",
        "bash tools/carry_prepare.sh", "benchmarks.md",
    ),
    "Where things are": ("`install.py`", "`offload_core/`", "`webui/`, `scripts/`", "`tools/`"),
    "Tests": (
        "FERRY_COMFYUI", "FERRY_COMFYUI_GGUF", "FERRY_COMFYUI_PYTHON", "FERRY_FORGE_PYTHON",
        "FERRY_GRADIO3_PYTHON", "FERRY_FORGE_MODELS", "FERRY_FORGE_SCREENSHOTS",
        ".venv-gradio4", "tests/comfyui/run_cores.sh", "bash tools/real_hosts.sh",
        "tests/test_templates.py", "tests/test_registry_pack.py", "tests/webui_standins.py",
        "tests/comfyui/test_comfyui_frontend.py", "real-hosts.md",
    ),
}  # fmt: skip


def missing_terms(pages: list[Path], terms: dict[str, tuple[str, ...]]) -> dict[str, list[str]]:
    """Per section, the terms written on none of ``pages`` (whitespace-insensitive)."""
    text = flat("\n".join(p.read_text(encoding="utf-8") for p in pages))
    out = {section: [t for t in wanted if flat(t) not in text] for section, wanted in terms.items()}
    return {section: lost for section, lost in out.items() if lost}


def test_every_old_sections_terms_are_findable_from_the_readme() -> None:
    pages = reachable_from_readme()
    lost = missing_terms(pages, ANCHOR_TERMS)
    shown = ", ".join(str(p.relative_to(REPO)) for p in pages)
    assert not lost, (
        f"terms of the old README no longer written in the README or a page it links to "
        f"({shown}): {lost}; put them back, in the README or in the docs/ page of their section"
    )


def test_a_page_that_drops_a_section_is_caught() -> None:
    """The check above can fail: without the Forge page, Forge's terms are reported lost."""
    pages = [p for p in reachable_from_readme() if p.name != "forge.md"]
    lost = missing_terms(pages, ANCHOR_TERMS)
    assert "Stable Diffusion WebUI Forge" in lost, lost
    assert "alwayson_scripts" in lost["Stable Diffusion WebUI Forge"]


def _registry_id() -> str:
    """Ferry's id in the Comfy Registry: ``[project] name`` in pyproject.toml."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    found = re.search(r'^name\s*=\s*"([^"]+)"', project, re.M)
    assert found, "pyproject.toml has no [project] name"
    return found.group(1)


def _first_screen() -> str:
    return "\n".join(README.read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN_LINES])


def test_the_first_screen_has_the_three_installs() -> None:
    screen = _first_screen()
    wanted = [
        "ComfyUI-Manager",
        f"comfy node install {_registry_id()}",
        "git clone https://github.com/",
        "custom_nodes",
    ]
    absent = [w for w in wanted if w not in screen]
    assert not absent, f"README's first {FIRST_SCREEN_LINES} lines lack the install: {absent}"


def test_the_first_screen_has_the_one_node_recipe() -> None:
    screen = flat(_first_screen())
    assert "Put **Ferry Offload Model** right after your model's loader" in screen, screen
    assert "leave its widgets on `auto`" in screen, screen
    assert re.search(r"Loader\S*\)? -> Ferry Offload Model -> .*KSampler", screen), screen


def test_the_first_screen_has_a_picture_that_exists() -> None:
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", _first_screen())
    assert images, f"README's first {FIRST_SCREEN_LINES} lines show no picture"
    for target in images:
        assert not re.match(r"[a-z]+:", target), f"{target}: a picture from the repository"
        assert (REPO / target).is_file(), f"README's picture {target} is not in the repository"


def test_the_two_commands_are_near_the_top_and_ci_runs_the_test_command() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()[:TWO_COMMANDS_BY_LINE]
    commands = [line.split("#", 1)[0].strip() for line in lines if line.startswith("bash run.sh")]
    assert "bash run.sh" in commands, f"no `bash run.sh` in README's first lines: {commands}"
    tests = [c for c in commands if c.startswith("bash run.sh test")]
    assert tests, f"no `bash run.sh test` in README's first {TWO_COMMANDS_BY_LINE} lines"
    ci = [
        line.strip()
        for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if not line.lstrip().startswith("#")
    ]
    assert tests[0] in ci, f".ci/run does not run the README's test command {tests[0]!r}"
