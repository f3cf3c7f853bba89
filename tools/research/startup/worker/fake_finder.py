"""The meta-path finder that serves the fake hardware modules (`fake_hw`) ahead of sys.path, and the
set of modules it serves."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import types
from typing import Any

from .fake_cpu import build_psutil
from .fake_hw import Hardware, _FakeModule, build_pynvml, build_torch, build_triton
from .standins import STANDIN_MARK, requested_from


class FakeModuleFinder(importlib.abc.MetaPathFinder):
    """Serve fixed modules (and stand-in submodules under them) ahead of sys.path.

    Put first on ``sys.meta_path`` so an installed torch can never be used by
    SGLang; other packages (transformers) are not served and see no torch.
    """

    def __init__(self, modules: dict[str, types.ModuleType], requesters: tuple[str, ...]) -> None:
        self.modules = modules
        self.requesters = requesters
        self.roots = frozenset(name.partition(".")[0] for name in modules)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname.partition(".")[0] not in self.roots:
            return None
        if not requested_from(self.requesters):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = self.modules.get(spec.name)
        if module is None:
            module = _FakeModule(spec.name)
            setattr(module, STANDIN_MARK, True)
            module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        parent, _, child = module.__name__.rpartition(".")
        if parent and parent in self.modules:
            setattr(self.modules[parent], child, module)


def fake_hardware_modules(hw: Hardware) -> dict[str, types.ModuleType]:
    """All modules the fake-hardware finder serves."""
    mods = build_torch(hw)
    mods.update(build_triton(hw))
    mods["pynvml"] = build_pynvml(hw)
    if hw.cpu is not None:  # SGLang's CPU engine sizes itself from psutil
        mods["psutil"] = build_psutil(hw.cpu)
    return mods
