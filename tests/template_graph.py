"""Reading a ComfyUI UI-format workflow (example_workflows/*.json): its nodes, links and what
feeds what. Used by the CI template checks and the real-frontend suite."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import REPO

TEMPLATES = REPO / "example_workflows"
#: Node types that are notes (the frontend's own), not executed.
NOTE_TYPES = ("MarkdownNote", "Note")


def template_paths() -> list[Path]:
    return sorted(TEMPLATES.glob("*.json"))


@dataclass
class Workflow:
    path: Path
    data: dict[str, Any]

    @classmethod
    def load(cls, path: Path) -> Workflow:
        return cls(path, json.loads(path.read_text(encoding="utf-8")))

    @property
    def nodes(self) -> list[dict[str, Any]]:
        return self.data["nodes"]  # type: ignore[no-any-return]

    def node(self, nid: int) -> dict[str, Any]:
        return next(n for n in self.nodes if n["id"] == nid)

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [n for n in self.nodes if n["type"] == type_]

    def notes(self) -> list[str]:
        return [n["widgets_values"][0] for n in self.nodes if n["type"] in NOTE_TYPES]

    def source(self, node: dict[str, Any], input_name: str) -> dict[str, Any] | None:
        """The node whose output feeds ``input_name`` of ``node`` (None: not linked)."""
        inp = next((i for i in node["inputs"] if i["name"] == input_name), None)
        if inp is None or inp.get("link") is None:
            return None
        link = next(lk for lk in self.data["links"] if lk[0] == inp["link"])
        return self.node(link[1])

    def chain(self, node: dict[str, Any], input_name: str) -> list[str]:
        """The types upstream of ``node`` along ``input_name`` and then each node's first
        input of the same kind, nearest first (KSampler.model -> [FerryOffloadModel,
        UNETLoader])."""
        out = []
        src = self.source(node, input_name)
        while src is not None:
            out.append(src["type"])
            kind = next((o["type"] for o in src["outputs"]), None)
            nxt = next((i["name"] for i in src["inputs"] if i["type"] == kind), None)
            src = self.source(src, nxt) if nxt else None
        return out
