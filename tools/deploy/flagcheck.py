"""Checking `--set`/`--unset` edits against the running version's flag catalog before any restart.

A typo in a flag name, a value of the wrong type or outside the flag's choices would otherwise cost a
restart into a server that refuses to start, and another one to roll back. `refusals` is everything
`optagent deploy --set` refuses before a restart (the fixed ranges of `flagbounds`, then the
catalog); `optagent research FLAG --value V` calls the same function, so a value deploy refuses
never comes out of research as one that applies.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from tools.deploy.flagbounds import value_problems
from tools.research.catalog import FlagInfo, find_flag

__all__ = ["check_edits", "refusals"]

_HUMAN_INT = re.compile(r"-?\d+(\.\d+)?[kKmMgGtT]?\Z")
Edit = tuple[str, str, str | None]
"""("set" | "unset", "--flag", value or None)."""


def _close(catalog: Sequence[FlagInfo], flag: str) -> str:
    names = [n for f in catalog for n in (f.name, *f.aliases)]
    close = difflib.get_close_matches(flag, names, n=3, cutoff=0.8)
    return f"; did you mean {', '.join(close)}?" if close else ""


def _value_problem(info: FlagInfo, value: str) -> str | None:
    kind = (info.type or "").lower()
    items = value.split() if kind.startswith("list[") else [value]
    base = kind[5:-1] if kind.startswith("list[") else kind
    for item in items:
        if base == "int" and not _HUMAN_INT.match(item):
            return f"expects an integer, got {item!r}"
        if base == "float":
            try:
                float(item)
            except ValueError:
                return f"expects a number, got {item!r}"
    if info.choices:
        allowed = [str(c) for c in info.choices]
        bad = [item for item in items if item not in allowed]
        if bad:
            near = difflib.get_close_matches(bad[0], allowed, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            return f"must be one of {', '.join(allowed)}; got {bad[0]!r}{hint}"
    return None


def check_edits(catalog: Sequence[FlagInfo], edits: Sequence[Edit], *, version: str) -> list[str]:
    """One message per edit that the version's `launch_server` would refuse (empty: all fine)."""
    problems: list[str] = []
    for op, flag, value in edits:
        info = find_flag(list(catalog), flag)
        if info is None:
            problems.append(f"{flag} is not a flag of sglang {version}{_close(catalog, flag)}")
            continue
        if op == "unset":
            continue
        if (info.type or "").lower() == "bool":
            if value is not None:
                problems.append(
                    f"{flag} is a switch and takes no value: use --set {flag[2:]} (or --unset it)"
                )
        elif value is None:
            problems.append(f"{flag} needs a value: --set {flag[2:]}=VALUE")
        else:
            why = _value_problem(info, value)
            if why:
                problems.append(f"{flag} {why}")
    return problems


def refusals(catalog: Sequence[FlagInfo], edits: Sequence[Edit], *, version: str) -> list[str]:
    """What `optagent deploy` refuses of `edits` before any restart, one message each (empty: none):
    a value outside the range SGLang accepts whatever the deployment (`flagbounds`) first, as deploy
    checks it, then the version's catalog (name, switch or value, type, choices). An empty catalog
    (the source could not be read) checks the ranges only, as deploy then does."""
    bounds = value_problems({flag: value for op, flag, value in edits if op == "set"})
    return bounds or (check_edits(catalog, edits, version=version) if catalog else [])
