"""On PYTHONPATH for the stand-in runs: installs tests/platform_standin.py's stand-in named by
FERRY_PLATFORM_STANDIN in this Python and, through the environment, in its child processes."""

import os
import sys

_which = os.environ.get("FERRY_PLATFORM_STANDIN")
if _which:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import platform_standin

    sys.path.pop(0)
    platform_standin.install(_which)
