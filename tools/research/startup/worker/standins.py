"""Permissive stand-ins for third-party modules that are not installed.

A stand-in represents "a dependency SGLang expects to be installed, whose
contents we do not model".  Every attribute of a stand-in module is a
stand-in class, which can be called, subclassed, iterated (as empty), used as
a decorator, a context manager, or an index, and is falsy.  Stand-ins never
decide anything on purpose: the resolver reports an error that originates in
one as "unknown", never as SGLang refusing to start.

Modules are served by :class:`StandInFinder`, which sits at the *end* of
``sys.meta_path`` and therefore only answers for modules that nothing else
(the SGLang tree, the real installed packages, the stdlib) provides.
"""

from __future__ import annotations

import abc
import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any

#: Marker attribute present on every stand-in module and class.
STANDIN_MARK = "__sglang_resolver_standin__"


class StandInMeta(abc.ABCMeta):
    """Metaclass making stand-in *classes* permissive at class level.

    Derived from ABCMeta so SGLang classes can mix a stand-in base with ABC.
    """

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return make_standin(f"{cls.__qualname__}.{name}")

    def register(cls, *args: Any, **kwargs: Any) -> Any:
        """Shadow ABCMeta.register: stand-ins are registries of anything (HF Auto*)."""
        return args[0] if args else None

    def __iter__(cls) -> Iterator[Any]:
        return iter(())

    def __len__(cls) -> int:
        return 0

    def __bool__(cls) -> bool:
        return False

    def __getitem__(cls, item: Any) -> Any:
        return make_standin(f"{cls.__qualname__}[...]")

    def __or__(cls, other: Any) -> Any:  # typing unions such as `A | None`
        return cls

    __ror__ = __or__

    def __repr__(cls) -> str:
        return f"<stand-in {cls.__qualname__}>"


class StandIn(metaclass=StandInMeta):
    """Base of all stand-in classes; instances are permissive too."""

    def __init_subclass__(cls, **kwargs: Any) -> None:  # e.g. `class X(Base, frozen=True)`
        super().__init_subclass__()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """Used as a field type in a (real) pydantic model: accept anything."""
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Used as a decorator: keep the decorated function usable.
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return make_standin(f"{type(self).__qualname__}()")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return make_standin(f"{type(self).__qualname__}.{name}")

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False

    def __getitem__(self, item: Any) -> Any:
        return make_standin(f"{type(self).__qualname__}[...]")

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<stand-in {type(self).__qualname__} instance>"


def _permissive_dunders() -> dict[str, Any]:
    """Numbers convert to 0; arithmetic on a stand-in yields the stand-in."""
    ops: dict[str, Any] = {
        "__int__": lambda self: 0,
        "__index__": lambda self: 0,
        "__float__": lambda self: 0.0,
        "__neg__": lambda self: self,
        "__pos__": lambda self: self,
        "__invert__": lambda self: self,
    }
    for op in (
        "add",
        "sub",
        "mul",
        "truediv",
        "floordiv",
        "mod",
        "pow",
        "and",
        "xor",
        "lshift",
        "rshift",
        "matmul",
    ):
        ops[f"__{op}__"] = ops[f"__r{op}__"] = lambda self, other: self
    return ops


for _cls in (StandInMeta, StandIn):
    for _name, _fn in _permissive_dunders().items():
        setattr(_cls, _name, _fn)


def make_standin(qualname: str) -> type:
    """Return a fresh stand-in class named ``qualname``."""
    cls = StandInMeta(qualname.rsplit(".", 1)[-1], (StandIn,), {STANDIN_MARK: True})
    cls.__qualname__ = qualname
    return cls


class StandInModule(types.ModuleType):
    """A module whose every (non-dunder) attribute is a stand-in class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = make_standin(f"{self.__name__}.{name}")
        setattr(self, name, value)  # stable identity for `is` comparisons
        return value


_IMPORT_MACHINERY = ("<frozen importlib", os.path.dirname(importlib.__file__))


def requested_from(prefixes: tuple[str, ...]) -> bool:
    """True if the code asking for an import lives under one of ``prefixes``.

    Walks out of the import machinery to the frame that issued the ``import``
    (or ``importlib.import_module`` / ``find_spec``) and checks its file.
    Real third-party packages thus never see stand-ins through their own
    availability probes; only SGLang's source does.
    """
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_IMPORT_MACHINERY) and filename != __file__:
            return filename.startswith(prefixes)
        frame = frame.f_back
    return False


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StandInModule(spec.name)
        setattr(module, STANDIN_MARK, True)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []  # a package, so `import a.b.c` works
        module.__version__ = "0.0.0"


class StandInFinder(importlib.abc.MetaPathFinder):
    """Serve stand-ins for missing third-party modules (append last to meta_path).

    ``absent`` lists top-level names that must stay missing (ImportError), e.g.
    other vendors' platform packages that a CUDA deployment does not have.
    ``requesters`` are the path prefixes of code allowed to receive stand-ins
    (the SGLang tree).  ``used`` records every top-level name served.
    """

    def __init__(
        self, absent: Iterable[str], own_packages: Iterable[str], requesters: tuple[str, ...]
    ) -> None:
        self.absent = frozenset(absent)
        self.requesters = requesters
        self.own = frozenset(own_packages)
        self.used: set[str] = set()
        self._loader = _StandInLoader()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        top = fullname.partition(".")[0]
        if top in self.absent or top in self.own or top in sys.stdlib_module_names or top.startswith("_"):
            return None
        if top != fullname and not isinstance(sys.modules.get(top), StandInModule):
            return None  # a missing submodule of a real package stays missing
        if not requested_from(self.requesters):
            return None
        self.used.add(top)
        return importlib.machinery.ModuleSpec(fullname, self._loader, is_package=True)
