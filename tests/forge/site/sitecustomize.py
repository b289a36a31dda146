"""Put on Forge's PYTHONPATH by tests/forge/conftest.py: placeholder modules for torchvision.

PyPI's torchvision cannot register its C++ ops with the CPU torch 2.13 build these machines use
(``operator torchvision::nms does not exist`` at import), and Forge imports it at start-up for
upscalers and preprocessors that a txt2img on an SD 1.5 checkpoint never runs. Every
``torchvision.*`` import gets a placeholder whose attributes, and what calling one returns, are
more placeholders (builtin extensions build transforms at import). Nothing on the tested path
uses one: a placeholder where a tensor or an image is needed fails at once.
"""

import importlib.abc
import importlib.machinery
import sys
import types


class _Placeholder(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        return _Placeholder(f"{self.__name__}()")

    def __mro_entries__(self, bases):
        return (object,)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Placeholder(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        module.__version__ = "0.0.0+placeholder"


sys.meta_path.insert(0, _Finder())
