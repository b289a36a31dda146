"""What the loader did, per layer and in total: printed by the CLI, shown by the nodes and panel."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..units import fmt_bytes


@dataclass(frozen=True)
class LayerReport:
    name: str
    kind: str  # the module's class name
    quantized: bool
    reason: str  # why it was left in full precision; "" when quantized
    bytes_before: int
    bytes_after: int


@dataclass
class QuantReport:
    preset: str
    device: str
    layers: list[LayerReport] = field(default_factory=list)
    # "off" (no cache_dir), "hit", "miss", "stale" / "corrupt" (rebuilt), "write failed: …"
    cache: str = "off"
    cache_path: str | None = None
    seconds: float = 0.0

    @property
    def bytes_before(self) -> int:
        return sum(r.bytes_before for r in self.layers)

    @property
    def bytes_after(self) -> int:
        return sum(r.bytes_after for r in self.layers)

    @property
    def quantized(self) -> list[LayerReport]:
        return [r for r in self.layers if r.quantized]

    @property
    def skipped(self) -> list[LayerReport]:
        return [r for r in self.layers if not r.quantized]

    def summary(self) -> str:
        return (
            f"{self.preset} on {self.device}: {len(self.quantized)} of {len(self.layers)} layers "
            f"quantized, {fmt_bytes(self.bytes_before)} -> {fmt_bytes(self.bytes_after)}, "
            f"cache {self.cache}, {self.seconds:.2f} s"
        )

    def describe(self) -> str:
        """A table, one row per layer, then the summary line."""
        width = max([len(r.name) for r in self.layers] + [5])
        lines = [f"{'layer':<{width}}  {'before':>10}  {'after':>10}  status"]
        for r in self.layers:
            status = "quantized" if r.quantized else f"kept: {r.reason}"
            lines.append(
                f"{r.name or '(root)':<{width}}  {fmt_bytes(r.bytes_before):>10}  "
                f"{fmt_bytes(r.bytes_after):>10}  {status}"
            )
        lines.append(self.summary())
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bytes_before"] = self.bytes_before
        d["bytes_after"] = self.bytes_after
        return d

    def layers_json(self) -> str:
        return json.dumps([asdict(r) for r in self.layers])

    @staticmethod
    def layers_from_json(text: str) -> list[LayerReport]:
        return [LayerReport(**d) for d in json.loads(text)]
