"""Stand-ins for packages ComfyUI imports at module level but never uses on the diffusion path.

torchvision has no wheel matching the CPU torch 2.13 build used here, and ComfyUI's
``comfy.sd`` imports it (for VAEs and image nodes) at import time. Installed only when the
real package is missing: any ``torchvision.*`` import then gets a module whose attributes are
more stand-ins, and calling one raises, so a use on the measured path fails loudly.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any


class _Stub(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self.__name__}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.__name__} is a stand-in (the package is not installed)")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname == self.root or fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Stub(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []  # a package: submodule imports come back here


def stub_if_missing(name: str) -> bool:
    """Installs the stand-in for ``name`` when it cannot be imported; True if it did."""
    if name in sys.modules or importlib.util.find_spec(name) is not None:
        return False
    sys.meta_path.append(_Finder(name))
    return True
