"""Put on the ComfyUI server's PYTHONPATH by conftest.py: stand-ins for torchvision and av when
they are missing (no torchvision wheel matches the CPU torch 2.13 build; ComfyUI imports both
at module level, never on the paths these tests run). Any use of a stand-in raises."""

import os
import sys

sys.path.insert(0, os.environ["FERRY_REPO"])
from bench.h2h_stubs import stub_if_missing

for _name in ("torchvision", "torchaudio", "av"):
    stub_if_missing(_name)
sys.path.remove(os.environ["FERRY_REPO"])
