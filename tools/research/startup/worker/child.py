"""Resolver worker: run SGLang's own ServerArgs resolution on fake hardware.

Run as ``python -I -m``-less script (see ``resolve_args._worker_command``).
Protocol, JSON lines over stdin/stdout:

* first line: ``{"tree_root": str, "hw": {...}, "env": {...}, "fork": bool, "limits": {...},
  "read": [...], "landlock": bool}`` (``env``: the deployment's own SGLang variables, set before
  SGLang is imported; ``limits``: ``RLIMIT_*`` values set first; ``read``: the paths Landlock lets
  it read, with ``landlock``); the answer ``{"ready": ...}`` says which Landlock ABI it applied
* then per request: ``{"argv": [...]}`` -> one response line,
  ``{"ok": true, "args": {...}, "checks": null | str}`` (``checks``: why the launch's checks of
  the record could not run here) or
  ``{"ok": false, "kind": "refused"|"unknown", "error": str, "where": str}``.

With ``fork`` the worker imports SGLang once and forks a fresh process per
request, so global state changed by one resolution (os.environ, caches,
published server args) never leaks into the next.

Bootstrapping is in ``boot.py``, one resolution in ``resolution.py``, error classification in
``errors.py``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import linecache
import os
import random
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import sandbox, standins
from .boot import import_server_args, install_import_system, prewarm_real_packages
from .errors import classify
from .fake_hw import Hardware
from .resolution import CHECKS_KEY, PARSED_KEY, parsed_argv, resolve_argv, to_json


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
    executed lines of the tree that mention those names, in order (at most the last 12). The
    launch's checks of the record refuse it only where SGLang's own raise or assert does; when
    they cannot run here, `checks` says why and the resolution stands."""

    def own(exc: BaseException) -> bool:
        return classify(exc, tree_root, "")["kind"] == "refused"

    used_before = set(finder.used)
    random.seed(0)  # SGLang draws e.g. random_seed from `random`: keep runs comparable
    stderr = io.StringIO()
    tracer = LineWatch(tree_root, watch) if watch else None
    start = time.perf_counter()
    try:
        with contextlib.redirect_stderr(stderr):
            sys.settrace(tracer)
            try:
                args = resolve_argv(server_args_mod, argv, refused=own)
            finally:
                sys.settrace(None)
            args[PARSED_KEY] = parsed_argv(server_args_mod, argv)  # untraced: not where it settles
        result: dict[str, Any] = {"ok": True, "checks": args.pop(CHECKS_KEY), "args": args}
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
    sandbox.limit(config.get("limits") or {})
    tree_root = Path(config["tree_root"]).resolve()
    try:
        hw = Hardware.from_dict({"torch_version": pinned_torch(tree_root), **config["hw"]})
    except (TypeError, ValueError) as exc:  # a fact that is no fact: nothing of the tree runs
        proto_out.write(json.dumps({"ready": False, "facts_refused": True, "error": str(exc)}) + "\n")
        return
    use_fork = bool(config.get("fork", True))

    scratch = Path(tempfile.mkdtemp(prefix="sglang-resolver-"))
    os.environ.update(config.get("env") or {})  # the sandbox's own settings below win
    read = [Path(p) for p in config.get("read") or []]
    sandbox.install(hw, scratch, read=read, use_landlock=bool(config.get("landlock")))
    sandbox.allow_fork(_forked.__code__)
    start = time.perf_counter()
    prewarm_real_packages()
    sandbox.arm()
    finder = install_import_system(tree_root, hw)
    try:
        module = import_server_args()
        ready = {
            "ready": True,
            "import_seconds": round(time.perf_counter() - start, 3),
            "standin_modules": sorted(finder.used),
            "landlock": sandbox.LANDLOCK_ABI,
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
