"""What each loader holds in RAM while it loads a file and after, per ComfyUI core: measured
by tests/comfyui/test_comfyui_loader_costs.py on each supported core, which fails where a
core's figure leaves its row here by more than 15 % (or 64 MiB).

Figures are the process's RssAnon (its own memory, not the page cache) added by the loader,
as a multiple of the file's size: ``peak`` while it loads, ``held`` once loaded. ``mapped``:
the weights stay pages of the file (they count as the page cache, which the kernel can drop
and read again) rather than copies in the process's own memory.

Rows are keyed by the loader's class and the oldest core they hold for: a core uses the row
of the newest listed core not newer than it. A loader or core not listed has no row: the
pre-flight then says nothing of the loader's cost.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoaderCost:
    mapped: bool
    peak: float  # RssAnon added while loading, x the file's size
    held: float  # RssAnon added once loaded, x the file's size

    def sentence(self, loader: str) -> str:
        """What the pre-flight says of it."""
        how = "maps the file" if self.mapped else "copies the file into RAM"
        return (
            f"{loader} on this ComfyUI {how}: peak {self.peak:.1f}x the file while loading, "
            f"{self.held:.1f}x after"
        )


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


#: (loader class, oldest core) -> its cost, as the test printed it on v0.3.64; v0.8.0 and
#: v0.33.0 measured the same within the test's bounds (2026-11-29; a ~400 MiB float32 SD3
#: for the safetensors loaders, which every core keeps in float32 on a CPU; a ~424 MiB Q8_0
#: Wan for ComfyUI-GGUF). A loader that casts (a bf16 file held in float32) holds the cast
#: copy besides: ``held`` is of a file kept in its stored dtype.
LOADER_COSTS: dict[tuple[str, str], LoaderCost] = {
    ("UNETLoader", "0.3.64"): LoaderCost(mapped=False, peak=1.00, held=1.00),
    ("FerryLoadDiffusionModelQuantized", "0.3.64"): LoaderCost(mapped=True, peak=0.01, held=0.01),
    ("UnetLoaderGGUF", "0.3.64"): LoaderCost(mapped=True, peak=0.01, held=0.01),
}


#: Core's loaders and Ferry's loader of the same files, named where the core's copies.
FERRYS_INSTEAD = {"UNETLoader": ("FerryLoadDiffusionModelQuantized", "Ferry's loader")}


def load_sentence(loader: str, core_version: str) -> str | None:
    """The pre-flight's sentence of ``loader``'s cost on this core, naming Ferry's loader of
    the same file where that one maps what this one copies; None: no row."""
    cost = loader_cost(loader, core_version)
    if cost is None:
        return None
    said = cost.sentence(loader)
    ferrys, name = FERRYS_INSTEAD.get(loader, ("", ""))
    instead = loader_cost(ferrys, core_version) if ferrys else None
    if not cost.mapped and instead is not None and instead.mapped:
        said += f"; {name} maps it (peak {instead.peak:.2f}x)"
    return said


def loader_cost(loader: str, core_version: str) -> LoaderCost | None:
    """``loader``'s row for the core ``core_version`` ("0.3.64"), or None."""
    try:
        core = _version(core_version)
    except ValueError:
        return None
    rows = [(_version(v), c) for (name, v), c in LOADER_COSTS.items() if name == loader]
    older = [r for r in rows if r[0] <= core]
    return max(older, key=lambda r: r[0])[1] if older else None
