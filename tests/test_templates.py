"""example_workflows/: Ferry's templates, checked without ComfyUI against Ferry's node schemas
(tests/node_schemas.py): every Ferry node's inputs exist and hold legal values, no widget is
unknown, the graph is whole, each template covers the case it is for, and its note says which
files (and which third-party pack) it needs. The real frontend loads and runs them in
tests/comfyui/test_comfyui_frontend.py."""

from __future__ import annotations

import re
from typing import Any

import pytest

from offload_core.planner import MachineFacts, NetworkFacts, plan_graph
from tests.conftest import load_pack
from tests.node_schemas import node_schemas, widgets
from tests.template_graph import NOTE_TYPES, Workflow, template_paths

#: The core node types the templates use (ComfyUI v0.33.0's names).
CORE = {
    "UNETLoader", "DualCLIPLoader", "CLIPLoader", "CLIPTextEncode", "FluxGuidance",
    "ConditioningZeroOut", "EmptySD3LatentImage", "KSampler", "KSamplerAdvanced", "VAELoader",
    "VAEDecode", "SaveImage", "ModelSamplingSD3", "EmptyHunyuanLatentVideo", "CreateVideo",
    "SaveVideo", "TorchCompileModel", "EmptyLatentImage", *NOTE_TYPES,
}  # fmt: skip
#: Third-party node types a template may use, and the pack its note must name.
THIRD_PARTY = {"UnetLoaderGGUF": "ComfyUI-GGUF"}
#: Widgets naming a model file, per node type (core and third-party ones).
FILE_WIDGETS = {
    "UNETLoader": 1, "DualCLIPLoader": 2, "CLIPLoader": 1, "VAELoader": 1, "UnetLoaderGGUF": 1,
    "FerryLoadDiffusionModelQuantized": 1, "FerryLoadTextEncoder": 1,
    "FerryLoadTextEncoderDual": 2, "FerryLoadCheckpoint": 1,
}  # fmt: skip
PATHS = template_paths()
IDS = [p.stem for p in PATHS]


def ordered_widgets(node_id: str) -> list[dict[str, Any]]:
    return widgets(node_schemas()[node_id])


def test_the_seven_templates_are_shipped() -> None:
    assert IDS == [
        "01_model_bigger_than_gpu", "02_gguf_model", "03_whole_graph_bigger_than_ram",
        "04_wan22_two_experts", "05_torch_compile", "06_memory_report",
        "07_checkpoint_bigger_than_ram",
    ]  # fmt: skip


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_every_node_is_known_and_the_graph_is_whole(path: Any) -> None:
    wf = Workflow.load(path)
    ferry = node_schemas()
    ids = {n["id"] for n in wf.nodes}
    for n in wf.nodes:
        known = n["type"] in ferry or n["type"] in CORE or n["type"] in THIRD_PARTY
        assert known, f"{path.name}: node {n['id']} is a {n['type']} nobody ships"
    for lid, src, slot, dst, dslot, typ in wf.data["links"]:
        assert src in ids and dst in ids, lid
        assert wf.node(dst)["inputs"][dslot]["link"] == lid
        assert lid in wf.node(src)["outputs"][slot]["links"]
        assert wf.node(src)["outputs"][slot]["type"] == typ
    for n in wf.nodes:
        for inp in n["inputs"]:
            if inp.get("widget") is None and n["type"] not in NOTE_TYPES:
                # Every link input is connected: a template runs as shipped.
                assert inp["link"] is not None, (path.name, n["type"], inp["name"])
    assert wf.data["last_node_id"] >= max(ids)


def _legal(w: dict[str, Any], value: Any) -> str | None:
    """Why ``value`` is not legal for widget ``w`` (None: it is)."""
    kind = w["kind"]
    if kind == "COMBO":
        if "files" in w:  # a file name ComfyUI lists at run time
            ok = isinstance(value, str) and re.fullmatch(r"[\w.\-]+\.(safetensors|gguf)", value)
            return None if ok else f"{value!r} is not a model file name"
        return None if value in w["options"] else f"{value!r} not in {w['options']}"
    if kind == "BOOLEAN":
        return None if isinstance(value, bool) else f"{value!r} is not a boolean"
    if kind == "STRING":
        return None if isinstance(value, str) else f"{value!r} is not text"
    if kind == "INT" and (not isinstance(value, int) or isinstance(value, bool)):
        return f"{value!r} is not a whole number"
    if kind == "FLOAT" and not isinstance(value, (int, float)):
        return f"{value!r} is not a number"
    if value < w.get("min", value) or value > w.get("max", value):
        return f"{value!r} is outside {w.get('min')}..{w.get('max')}"
    return None


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_every_ferry_node_has_its_inputs_and_legal_values(path: Any) -> None:
    wf = Workflow.load(path)
    schemas = node_schemas()
    ferry_nodes = [n for n in wf.nodes if n["type"] in schemas]
    assert ferry_nodes, f"{path.name} has no Ferry node"
    for n in ferry_nodes:
        schema = schemas[n["type"]]
        ws = ordered_widgets(n["type"])
        values = n["widgets_values"]
        # No unknown widget, none missing: one value per widget, in the frontend's order.
        assert len(values) == len(ws), (path.name, n["type"], values, [w["name"] for w in ws])
        for w, v in zip(ws, values):
            why = _legal(w, v)
            assert why is None, f"{path.name}: {n['type']}.{w['name']}: {why}"
        links = {i["name"] for i in schema["inputs"]} - {w["name"] for w in ws}
        for inp in n["inputs"]:
            if inp.get("widget") is not None:
                assert inp["widget"]["name"] in {w["name"] for w in ws}, (n["type"], inp)
                continue
            assert inp["name"] in links, f"{path.name}: {n['type']} has no input {inp['name']}"
            want = next(i["kind"] for i in schema["inputs"] if i["name"] == inp["name"])
            assert want in ("*", inp["type"]), (n["type"], inp["name"], inp["type"], want)
        for i in schema["inputs"]:
            if not i["optional"] and i["kind"] not in (
                "COMBO",
                "INT",
                "FLOAT",
                "STRING",
                "BOOLEAN",
            ):
                assert any(x["name"] == i["name"] for x in n["inputs"]), (n["type"], i["name"])


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_ferry_offload_settings_pass_the_nodes_own_checks(path: Any) -> None:
    # The same parser the node runs (nodes/planning/config.py): a template never fails validation.
    config = __import__(f"{load_pack().__name__}.nodes.planning.config", fromlist=["NodeSettings"])
    wf = Workflow.load(path)
    for type_ in ("FerryOffloadModel", "FerryOffloadTextEncoder"):
        names = [w["name"] for w in ordered_widgets(type_)]
        for n in wf.of_type(type_):
            values = dict(zip(names, n["widgets_values"]))
            assert values.pop("use_panel_settings") is False  # the widgets are what runs
            # As the node does: the widgets parsed once (its execute and validate_inputs
            # parse the same way); what is set builds a policy, "auto" is the planner's.
            settings = config.NodeSettings.parse(values)
            net = NetworkFacts("m", "model", 1 << 30, (1 << 27,) * 8, wish=settings.wish)
            choice = plan_graph(MachineFacts(None, 64 << 30), [net]).choices[0]
            settings.policy(choice, "/tmp/ferry")


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_the_note_names_the_files_the_packs_and_what_ferry_does(path: Any) -> None:
    wf = Workflow.load(path)
    notes = wf.notes()
    assert len(notes) == 1, f"{path.name}: one note, got {len(notes)}"
    note = " ".join(notes[0].split())
    assert "What Ferry does here" in note
    for n in wf.nodes:
        for value in n["widgets_values"][: FILE_WIDGETS.get(n["type"], 0)]:
            assert f"`{value}`" in note or f"/{value}`" in note, (path.name, value)
        if n["type"] in THIRD_PARTY:
            assert THIRD_PARTY[n["type"]] in note, (path.name, n["type"])
    if not any(n["type"] in THIRD_PARTY for n in wf.nodes):
        assert "no other pack" in note


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_every_template_has_a_jpeg_thumbnail(path: Any) -> None:
    thumb = path.with_suffix(".jpg")
    assert thumb.is_file(), f"no thumbnail {thumb.name}"
    data = thumb.read_bytes()
    assert data[:3] == b"\xff\xd8\xff" and 5_000 < len(data) < 500_000, len(data)


def _wf(name: str) -> Workflow:
    return Workflow.load(next(p for p in PATHS if p.stem == name))


def test_each_template_shows_its_case() -> None:
    one = _wf("01_model_bigger_than_gpu")
    (ks,) = one.of_type("KSampler")
    assert one.chain(ks, "model") == ["FerryOffloadModel", "UNETLoader"]
    two = _wf("02_gguf_model")
    assert two.chain(two.of_type("KSampler")[0], "model") == ["FerryOffloadModel", "UnetLoaderGGUF"]
    three = _wf("03_whole_graph_bigger_than_ram")
    assert three.chain(three.of_type("KSampler")[0], "model") == [
        "FerryOffloadModel", "FerryLoadDiffusionModelQuantized",
    ]  # fmt: skip
    (enc,) = three.of_type("CLIPTextEncode")
    assert three.chain(enc, "clip") == ["FerryOffloadTextEncoder", "FerryLoadTextEncoderDual"]
    assert {n["widgets_values"][3] for n in three.of_type("FerryOffloadModel")} == {"disk"}
    four = _wf("04_wan22_two_experts")
    experts = [four.chain(k, "model") for k in four.of_type("KSamplerAdvanced")]
    assert experts == [["ModelSamplingSD3", "FerryOffloadModel", "UNETLoader"]] * 2
    files = {n["widgets_values"][0] for n in four.of_type("UNETLoader")}
    assert len(files) == 2 and all("wan2.2" in f for f in files)
    five = _wf("05_torch_compile")
    assert five.chain(five.of_type("KSampler")[0], "model")[:2] == [
        "FerryCompileBlocks", "FerryOffloadModel",
    ]  # fmt: skip
    six = _wf("06_memory_report")
    (report,) = six.of_type("FerryMemoryReport")
    assert six.source(report, "after")["type"] == "KSampler"  # type: ignore[index]
    assert six.chain(report, "model") == ["FerryOffloadModel", "UNETLoader"]
    seven = _wf("07_checkpoint_bigger_than_ram")
    (ks,) = seven.of_type("KSampler")
    assert seven.chain(ks, "model") == ["FerryOffloadModel", "FerryLoadCheckpoint"]
    for enc in seven.of_type("CLIPTextEncode"):
        assert seven.chain(enc, "clip") == ["FerryOffloadTextEncoder", "FerryLoadCheckpoint"]
    (decode,) = seven.of_type("VAEDecode")
    assert seven.source(decode, "vae")["type"] == "FerryLoadCheckpoint"  # type: ignore[index]
    offload = [*seven.of_type("FerryOffloadModel"), *seven.of_type("FerryOffloadTextEncoder")]
    assert {n["widgets_values"][3] for n in offload} == {"disk"}


def test_bake_lora_shows_only_where_the_network_bakes_and_comes_last() -> None:
    """Only Ferry Offload Model's site bakes (seam/site.py ``bakes``). The widget is the last,
    so a workflow saved while another offload node showed it still loads: the frontend sets
    widgets by position and drops values past the last one (LGraphNode.configure), and the
    server drops an input the node does not declare (execution.get_input_data)."""
    offload = {
        nid: [w["name"] for w in ordered_widgets(nid)]
        for nid in node_schemas()
        if nid.startswith("FerryOffload")
    }
    assert len(offload) == 5
    assert {nid for nid, names in offload.items() if "bake_lora" in names} == {"FerryOffloadModel"}
    model = offload.pop("FerryOffloadModel")
    assert model[-1] == "bake_lora"
    for nid, names in offload.items():
        assert names == model[:-1], nid  # the same widgets in the same places, less the last
