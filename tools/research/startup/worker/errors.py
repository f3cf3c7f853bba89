"""Error classification in the resolver worker (`child.run_request`): SGLang's own refusal (a
`raise`/`assert` of the tree, or argparse) told from an error caused by the stand-ins or fakes."""

from __future__ import annotations

import ast
import functools
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from . import fake_cpu, fake_finder, sandbox, standins
from .fake_hw import Hardware

#: Frames in these files mean an error went through a stand-in or fake.
_STANDIN_FILES = frozenset(
    {standins.__file__, sys.modules[Hardware.__module__].__file__, fake_finder.__file__, fake_cpu.__file__}
)


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
    chain_files = {f.filename for e in _chain(exc) for f in traceback.extract_tb(e.__traceback__)}
    tainted = "stand-in" in message or bool(chain_files & _STANDIN_FILES)
    denied = sandbox.__file__ in chain_files  # a probe the sandbox refused, re-raised by SGLang
    own_raise = (
        bool(frames)
        and frames[-1].filename.startswith(tree)
        and (_statement_kinds(frames[-1].filename).get(frames[-1].lineno) is not None)
    )
    if denied:
        kind, cause = "unknown", "denied"
    elif tainted:
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
