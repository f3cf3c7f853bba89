"""Resolver worker: run SGLang's own ServerArgs resolution on fake hardware.

Run as ``python -I -m``-less script (see ``resolve_args._worker_command``).
Protocol, JSON lines over stdin/stdout:

* first line: ``{"tree_root": str, "hw": {...}, "fork": bool}``
* then per request: ``{"argv": [...]}`` -> one response line,
  ``{"ok": true, "args": {...}}`` or
  ``{"ok": false, "kind": "refused"|"unknown", "error": str, "where": str}``.

With ``fork`` the worker imports SGLang once and forks a fresh process per
request, so global state changed by one resolution (os.environ, caches,
published server args) never leaks into the next.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import enum
import functools
import io
import json
import linecache
import os
import random
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import sandbox, standins
from .fake_hw import FakeModuleFinder, Hardware, fake_hardware_modules

_OWN_DIR = str(Path(__file__).resolve().parent)
#: Frames in these files mean an error went through a stand-in or fake.
_STANDIN_FILES = frozenset({standins.__file__, sys.modules[Hardware.__module__].__file__})

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


# --------------------------------------------------------------------------
# Bootstrapping
# --------------------------------------------------------------------------


def prewarm_real_packages() -> None:
    """Import the real transformers before any fake module exists.

    transformers decides once (cached) whether torch and friends are
    available; it must decide that on the real environment (no torch), not
    on the fakes SGLang is given.  Its torch-backed objects (placeholders
    that raise on use, e.g. ``AutoImageProcessor`` or ``modeling_llama``
    in some versions) are then served as stand-ins, like torch itself.
    """
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


# --------------------------------------------------------------------------
# One resolution
# --------------------------------------------------------------------------


def resolve_argv(server_args_mod: types.ModuleType, argv: list[str]) -> dict[str, Any]:
    """What `sglang.launch_server` does with argv up to the resolved record."""
    server_args = server_args_mod.prepare_server_args(argv)
    if hasattr(server_args, "resolve_once"):  # >= 0.5.2x: resolution is explicit
        if (
            getattr(server_args, "smg_grpc_mode", False) or getattr(server_args, "grpc_mode", False)
        ) and server_args.tokenizer_path is None:
            server_args.tokenizer_path = server_args.model_path  # as run_server does
        server_args.resolve_once()
    if hasattr(server_args, "resolved_dict"):
        values = server_args.resolved_dict()
    else:
        values = {f.name: getattr(server_args, f.name) for f in dataclasses.fields(server_args)}
    out = {key: to_json(value) for key, value in values.items()}
    out[MODEL_CONFIG_KEY] = model_config_facts(server_args)
    return out


MODEL_CONFIG_KEY = "__model_config__"
PARSED_KEY = "__parsed__"


def parsed_argv(server_args_mod: types.ModuleType, argv: list[str]) -> dict[str, Any] | None:
    """What SGLang's own parser stores for argv, before any resolution: a flag whose action stores
    nothing (a deprecation notice) leaves it as it was. None when the parser cannot be rebuilt."""
    import argparse

    parser = argparse.ArgumentParser()
    try:
        server_args_mod.ServerArgs.add_cli_args(parser)
        namespace, _ = parser.parse_known_args(argv)
    except (Exception, SystemExit):  # noqa: BLE001 - the resolution itself already succeeded
        return None
    return {key: to_json(value) for key, value in vars(namespace).items()}


def model_config_facts(server_args: Any) -> dict[str, Any]:
    """The scalar attributes of SGLang's own ModelConfig for this model and these arguments (what
    the model runner decides from: `is_hybrid_swa`, `attention_arch`, `quantization`, ...), or {}
    when it cannot be built here."""
    try:
        from sglang.srt.configs.model_config import ModelConfig

        config = ModelConfig.from_server_args(server_args)
    except Exception:  # noqa: BLE001 - model facts are extra: the resolution stands without them
        return {}
    facts: dict[str, Any] = {}
    members: set[str] = set()
    for name, value in vars(config).items():
        if name.startswith("_"):
            continue
        if isinstance(value, enum.Enum):  # `AttentionArch.MLA`, as the code compares it
            kind = type(value).__name__
            facts[name] = f"{kind}.{value.name}"
            members |= {f"{kind}.{m.name}" for m in type(value)}
        elif value is None or isinstance(value, (bool, int, float, str)):
            facts[name] = value
        elif isinstance(value, (list, tuple)) and all(
            v is None or isinstance(v, (bool, int, float, str)) for v in value
        ):
            facts[name] = list(value)
        elif not callable(value) and not isinstance(value, (list, tuple, dict, set)):
            facts[name] = f"<{type(value).__name__} object>"  # only that it is there is a fact
    facts[ENUM_MEMBERS] = sorted(members)
    return facts


ENUM_MEMBERS = "__enum_members__"


def to_json(value: Any) -> Any:
    """JSON-safe rendering of a resolved value (stand-ins become marked strings)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((to_json(v) for v in value), key=repr)
    if isinstance(value, (standins.StandIn, standins.StandInMeta)):
        return f"<stand-in {getattr(value, '__qualname__', type(value).__qualname__)}>"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    fields = getattr(type(value), "__struct_fields__", None)  # msgspec.Struct
    if fields is not None:
        return {name: to_json(getattr(value, name)) for name in fields}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return repr(value)


# --------------------------------------------------------------------------
# Error classification
# --------------------------------------------------------------------------


@functools.cache
def _statement_kinds(filename: str) -> dict[int, str]:
    """Map each line of a source file to the kind of statement covering it."""
    try:
        tree = ast.parse(Path(filename).read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    kinds: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Raise, ast.Assert)):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                kinds[line] = type(node).__name__
    return kinds


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def classify(exc: BaseException, tree_root: Path, stderr: str) -> dict[str, Any]:
    """Tell SGLang's own refusal from an error caused by the stand-ins.

    Refused: the innermost frame is a ``raise``/``assert`` statement in the
    SGLang tree (or argparse rejected the command line), and no exception in
    the chain passed through the stand-ins.  Anything else is "unknown".
    """
    tree = str(tree_root.resolve()) + os.sep
    frames = traceback.extract_tb(exc.__traceback__)
    in_tree = [f for f in frames if f.filename.startswith(tree)]
    where = f"{os.path.relpath(in_tree[-1].filename, tree_root)}:{in_tree[-1].lineno}" if in_tree else None
    if isinstance(exc, SystemExit):  # argparse: parser.error() -> exit(2)
        message = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {exc.code}"
        return {
            "kind": "refused" if exc.code else "unknown",
            "cause": "argparse",
            "error": f"SystemExit: {message}",
            "where": where,
        }
    message = f"{type(exc).__name__}: {exc}"
    tainted = "stand-in" in message or any(
        f.filename in _STANDIN_FILES for e in _chain(exc) for f in traceback.extract_tb(e.__traceback__)
    )
    own_raise = (
        bool(frames)
        and frames[-1].filename.startswith(tree)
        and (_statement_kinds(frames[-1].filename).get(frames[-1].lineno) is not None)
    )
    if tainted:
        kind, cause = "unknown", "standin"
    elif isinstance(exc, ImportError):
        kind, cause = "unknown", "import"
    elif own_raise:
        kind, cause = "refused", "raise"
    elif isinstance(exc, OSError):
        kind, cause = "unknown", "io"  # network/files denied or absent
    else:
        kind, cause = "unknown", "crash"  # not an explicit raise/assert
    return {
        "kind": kind,
        "cause": cause,
        "error": message,
        "where": where,
        "trace": "".join(traceback.format_exception(exc, limit=-6))[-3000:],
    }


class LineWatch:
    """A tracer that records the lines of the SGLang tree that run and mention one of `names` (the
    setting a flag writes): after a resolution, the last of them is where SGLang settled it."""

    def __init__(self, tree_root: Path, names: list[str]) -> None:
        self.prefix = str(tree_root.resolve()) + os.sep
        self.names = [n for n in names if n]
        self.lines: list[str] = []

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            text = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
            if any(n in text for n in self.names):
                where = f"{os.path.relpath(frame.f_code.co_filename, self.prefix)}:{frame.f_lineno}"
                if not self.lines or self.lines[-1] != where:
                    self.lines.append(where)
        return self._local

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_filename.startswith(self.prefix):
            return self._local
        return None


def run_request(
    server_args_mod: types.ModuleType,
    tree_root: Path,
    argv: list[str],
    finder: standins.StandInFinder,
    watch: list[str] | None = None,
) -> dict[str, Any]:
    """Resolve argv, catching everything; never raises. With `watch`, the answer's `lines` are the
    executed lines of the tree that mention those names, in order (at most the last 12)."""
    used_before = set(finder.used)
    random.seed(0)  # SGLang draws e.g. random_seed from `random`: keep runs comparable
    stderr = io.StringIO()
    tracer = LineWatch(tree_root, watch) if watch else None
    start = time.perf_counter()
    try:
        with contextlib.redirect_stderr(stderr):
            sys.settrace(tracer)
            try:
                args = resolve_argv(server_args_mod, argv)
            finally:
                sys.settrace(None)
            args[PARSED_KEY] = parsed_argv(server_args_mod, argv)  # untraced: not where it settles
        result: dict[str, Any] = {"ok": True, "args": args}
    except BaseException as exc:  # noqa: BLE001 - every failure is an answer
        result = {"ok": False, **classify(exc, tree_root, stderr.getvalue())}
    if tracer is not None:
        result["lines"] = tracer.lines[-12:]
    result["seconds"] = round(time.perf_counter() - start, 4)
    result["standin_modules_imported"] = sorted(finder.used - used_before)
    result["denied_probes"] = list(sandbox.DENIED)
    return result


def describe_cli(server_args_mod: types.ModuleType) -> list[dict[str, Any]]:
    """The flags ServerArgs registers: option strings, defaults, types, choices."""
    import argparse

    parser = argparse.ArgumentParser()
    server_args_mod.ServerArgs.add_cli_args(parser)
    flags = []
    for action in parser._actions:  # argparse has no public accessor
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        flags.append(
            {
                "options": list(action.option_strings),
                "dest": action.dest,
                "action": type(action).__name__,
                "nargs": action.nargs,
                "default": to_json(action.default),
                "const": to_json(action.const),
                "type": getattr(action.type, "__name__", None) if action.type else None,
                "choices": to_json(list(action.choices)) if action.choices is not None else None,
            }
        )
    return flags


def _forked(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run fn in a forked child and return its JSON answer.

    The answer carries ``imported``: modules the child imported lazily while
    resolving; the caller imports them in the worker so later forks start warm.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        before = set(sys.modules)
        try:
            answer = fn()
        except BaseException as exc:  # noqa: BLE001
            answer = {
                "ok": False,
                "kind": "unknown",
                "cause": "crash",
                "error": f"{type(exc).__name__}: {exc}",
                "where": None,
            }
        answer["imported"] = sorted(set(sys.modules) - before)
        with os.fdopen(write_fd, "wb") as out:
            out.write(json.dumps(answer).encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as inp:
        data = inp.read()
    os.waitpid(pid, 0)
    if not data:
        return {
            "ok": False,
            "kind": "unknown",
            "cause": "crash",
            "error": "resolver child died",
            "where": None,
        }
    return json.loads(data)


def warm_imports(names: list[str]) -> None:
    """Import modules a resolution imported lazily (errors ignored)."""
    import importlib

    for name in names:
        if name not in sys.modules:
            with contextlib.suppress(Exception):
                importlib.import_module(name)


def pinned_torch(tree_root: Path) -> str:
    """The torch version the wheel pins (what a real deployment would run)."""
    import re

    for metadata in tree_root.glob("sglang-*.dist-info/METADATA"):
        match = re.search(r"^Requires-Dist: torch==([\w.]+)", metadata.read_text(), re.M)
        if match:
            return match.group(1)
    return Hardware.torch_version


def main() -> None:
    # Keep the protocol channel private: stray prints go to stderr.
    proto_out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    config = json.loads(sys.stdin.readline())
    tree_root = Path(config["tree_root"]).resolve()
    hw = Hardware.from_dict({"torch_version": pinned_torch(tree_root), **config["hw"]})
    use_fork = bool(config.get("fork", True))

    scratch = Path(tempfile.mkdtemp(prefix="sglang-resolver-"))
    sandbox.install(hw, scratch)
    start = time.perf_counter()
    prewarm_real_packages()
    finder = install_import_system(tree_root, hw)
    try:
        module = import_server_args()
        ready = {
            "ready": True,
            "import_seconds": round(time.perf_counter() - start, 3),
            "standin_modules": sorted(finder.used),
        }
    except BaseException as exc:  # noqa: BLE001
        module = None
        ready = {"ready": False, **classify(exc, tree_root, "")}
    proto_out.write(json.dumps(ready) + "\n")

    for line in sys.stdin:
        request = json.loads(line)
        if module is None:
            answer = {"ok": False, **ready}
        elif request.get("describe_cli"):
            answer = {"ok": True, "flags": describe_cli(module)}
        else:
            job = functools.partial(
                run_request, module, tree_root, request["argv"], finder, request.get("watch")
            )
            answer = _forked(job) if use_fork else job()
        imported = answer.pop("imported", [])
        proto_out.write(json.dumps(answer) + "\n")
        warm_imports(imported)


if __name__ == "__main__":
    main()
