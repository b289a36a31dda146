"""The few places where Gradio 4.40 (Forge's) and Gradio 6 (the standalone panel) differ.

Every view takes its version-dependent keywords from here, so one panel codebase runs on both:
Gradio 6 moved ``show_api=False`` to ``api_visibility="private"`` and added ``ssr_mode`` to
``launch()`` (Gradio 5). Everything else the panel uses (gr.Timer, the native plots, gr.skip,
trigger modes) exists in both. Below 4.40 (no gr.Timer) the panel is not built at all.
"""

from __future__ import annotations

from typing import Any

#: The oldest Gradio the panel runs on (gr.Timer and the native plots arrived in 4.40).
MIN_GRADIO = (4, 40)


def version_tuple(version: str) -> tuple[int, int]:
    """The (major, minor) of a version string such as 4.40.0; (0, 0) when unreadable."""
    parts = [*version.split("."), "0"][:2]
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except ValueError:
        return 0, 0


def supported(version: str) -> bool:
    return version_tuple(version) >= MIN_GRADIO


def _major() -> int:
    import gradio

    return version_tuple(gradio.__version__)[0]


def private_api() -> dict[str, Any]:
    """Keywords that keep an event out of the API page."""
    return {"api_visibility": "private"} if _major() >= 6 else {"show_api": False}


def public_api() -> dict[str, Any]:
    return {"api_visibility": "public"} if _major() >= 6 else {}


def launch_options() -> dict[str, Any]:
    """launch() keywords only newer Gradio knows (server-side rendering off: no Node needed)."""
    return {"ssr_mode": False} if _major() >= 5 else {}
