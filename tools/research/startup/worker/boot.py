"""Bootstrapping the resolver worker (`child.main`): the real transformers imported before any fake
exists, then the import system (fake hardware modules first, the SGLang tree, real packages,
stand-ins last), then ServerArgs and what its resolution imports lazily."""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import standins
from .fake_finder import FakeModuleFinder, fake_hardware_modules
from .fake_hw import Hardware

_OWN_DIR = str(Path(__file__).resolve().parent)

# Other vendors' platform packages: absent on an NVIDIA deployment, so SGLang's
# `try: import x` probes must fail as they would there.
ABSENT_MODULES = (
    "torch_npu",
    "habana_frameworks",
    "intel_extension_for_pytorch",
    "torch_musa",
    "aiter",
    "amdsmi",
    "vllm",
    "mlx",
    "torch_xla",
    "ixformer",
    "torch_mlu",
)


def prewarm_real_packages() -> None:
    """Import the real transformers before any fake module exists.

    transformers decides once (cached) whether torch and friends are
    available; it must decide that on the real environment (no torch), not
    on the fakes SGLang is given.  Its torch-backed objects (placeholders
    that raise on use, e.g. ``AutoImageProcessor`` or ``modeling_llama``
    in some versions) are then served as stand-ins, like torch itself.
    """
    with contextlib.suppress(ImportError):
        import dill  # noqa: F401 - it reads ctypes.pythonapi at import, which the sandbox then refuses
    try:
        import transformers  # noqa: F401 - imported first, before any fake exists (see docstring)
        from transformers.utils import import_utils
    except ImportError:
        return
    import_utils.is_torch_available()
    lazy_module = import_utils._LazyModule
    lazy_module.__getattr__ = _torchless_getattr(lazy_module.__getattr__)
    for module in list(sys.modules.values()):  # placeholders resolved so far
        if isinstance(module, lazy_module):
            for name, value in list(vars(module).items()):
                if _is_backend_placeholder(value):
                    setattr(module, name, standins.make_standin(f"{module.__name__}.{name}"))
    for name in (
        "PretrainedConfig",
        "AutoConfig",
        "AutoTokenizer",
        "AutoProcessor",
        "AutoImageProcessor",
        "GenerationConfig",
    ):
        getattr(sys.modules["transformers"], name)


def _is_backend_placeholder(value: Any) -> bool:
    """transformers' DummyObject classes stand for objects whose backend is missing."""
    return isinstance(value, type) and getattr(value, "is_dummy", False) is True


def _torchless_getattr(original: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    """Wrap ``_LazyModule.__getattr__``: backend placeholders become stand-ins."""

    def __getattr__(self: Any, name: str) -> Any:
        try:
            value = original(self, name)
        except ImportError:  # needs torch (or another absent backend) to import
            if name.startswith("__"):
                raise
            value = None
        if value is None or _is_backend_placeholder(value):
            value = standins.make_standin(f"{self.__name__}.{name}")
            setattr(self, name, value)
        return value

    return __getattr__


def install_import_system(tree_root: Path, hw: Hardware) -> standins.StandInFinder:
    """Fake hardware modules first, the SGLang tree, real packages, stand-ins last."""
    requesters = (str(tree_root) + os.sep, _OWN_DIR + os.sep)
    sys.meta_path.insert(0, FakeModuleFinder(fake_hardware_modules(hw), requesters))
    sys.path.insert(0, str(tree_root))
    finder = standins.StandInFinder(ABSENT_MODULES, ("sglang",), requesters)
    sys.meta_path.append(finder)
    # A bare `sglang` package: its __init__ imports the whole runtime (the
    # frontend language, torch, HF patches); submodules load from the tree.
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [str(tree_root / "sglang")]
    pkg.__file__ = str(tree_root / "sglang" / "__init__.py")
    sys.modules["sglang"] = pkg
    return finder


# Modules that resolution imports lazily; importing them before forking makes
# each forked resolution cheap.  Missing ones (other versions) are skipped.
_LAZY_RESOLUTION_MODULES = (
    "sglang.srt.arg_groups.pipeline",
    "sglang.srt.configs.model_config",
    "sglang.srt.utils.hf_transformers_utils",
)


def import_server_args() -> types.ModuleType:
    """Import ServerArgs and what its resolution imports lazily."""
    import importlib

    module = importlib.import_module("sglang.srt.server_args")
    for name in _LAZY_RESOLUTION_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    return module
