"""The opt-in real-Forge suite: skipped unless FERRY_FORGE points at a Forge checkout.

    FERRY_FORGE=/path/to/stable-diffusion-webui-forge [FERRY_FORGE_PYTHON=/path/to/python] \
        python -m pytest tests/forge -q

Starts that Forge headless on the CPU (its own venv's python by default: <checkout>/venv) with
a fresh data folder whose extensions/ferry is a symlink to this repository, the checkpoints
and LoRA written by make_models.py (with Forge's own classes; kept between runs in
$FERRY_FORGE_MODELS, default <temp>/ferry-forge-models, 6.4 GB) and the settings file in the
data folder. site/sitecustomize.py stands in for torchvision, which cannot load here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FORGE = os.environ.get("FERRY_FORGE")

sys.path.insert(0, str(HERE))

from forge_server import Server, forge_checkout, models_dir, start_forge, stop_forge  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(
        reason="set FERRY_FORGE to a Forge checkout to run the real-Forge suite"
    )
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.forge)
            if not FORGE:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def models() -> Path:
    forge, py = forge_checkout()
    return models_dir(forge, py)


@pytest.fixture(scope="session")
def server(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_forge(tmp_path_factory.mktemp("forge-data"), models)
    try:
        yield srv
    finally:
        stop_forge(srv)
