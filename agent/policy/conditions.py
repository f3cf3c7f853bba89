"""A tiny, safe condition language over deployment facts (no `eval`).

A condition is `fact`, `not fact`, or `fact OP literal` with OP one of `== != > >= < <= in not in`;
a literal is a number, a quoted string, `true`/`false`/`none`, or a `[list]` of those. Facts are a
flat mapping such as `{"model.experts_per_tok": 8, "server.tp_size": 4, "gpu.sm": 120}`. The result
is `pass`, `fail` or `unknown` (a fact that is missing), with the actual value for the evidence.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Literal

Outcome = Literal["pass", "fail", "unknown"]

_COMPARISON = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(==|!=|>=|<=|>|<|not in|in)\s*(.+?)\s*$")
_BARE = re.compile(r"^\s*(not\s+)?([A-Za-z_][\w.]*)\s*$")
_FACT_NAME = re.compile(r"^[A-Za-z_]\w*\.[\w.]+$")
_MISSING = object()


class ConditionError(ValueError):
    """A condition that cannot be parsed."""


@dataclass(frozen=True)
class ConditionResult:
    """One condition checked against the facts."""

    condition: str
    outcome: Outcome
    actual: Any = None
    fact: str = ""

    def describe(self) -> str:
        """`model.experts_per_tok > 2 (actual 8): pass`."""
        shown = "missing" if self.outcome == "unknown" else repr(self.actual)
        return f"{self.condition} (actual {shown}): {self.outcome}"

    def plain(self) -> str:
        """The condition and what this deployment has, without a pass/fail word a reader must
        invert: `gpu.sm not in [80, 86, 89, 90] (here 120)`."""
        shown = "not known" if self.outcome == "unknown" else repr(self.actual)
        return f"{self.condition} (here {shown})"


def _literal(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError) as e:
        raise ConditionError(f"not a literal: {text!r}") from e


def _compare(actual: Any, op: str, expected: Any) -> bool:
    if op == "in":
        return actual in expected
    if op == "not in":
        return actual not in expected
    if op == "==":
        return actual == expected
    if op == "!=":
        return actual != expected
    try:
        return {
            ">": actual > expected,
            ">=": actual >= expected,
            "<": actual < expected,
            "<=": actual <= expected,
        }[op]
    except TypeError:
        return False


def parse_condition(condition: str) -> tuple[str, str, Any]:
    """Split a condition into `(fact, op, literal)`; a bare fact is `(fact, "truthy", None)`."""
    m = _BARE.match(condition)
    if m:
        return m.group(2), ("falsy" if m.group(1) else "truthy"), None
    m = _COMPARISON.match(condition)
    if not m:
        raise ConditionError(f"cannot parse condition {condition!r}")
    fact, op, literal = m.groups()
    return fact, op, _literal(literal)


def check(condition: str, facts: dict[str, Any]) -> ConditionResult:
    """Evaluate one condition; a missing fact gives `unknown`, never a guess (also a missing fact
    on the right: `server.x < bench.y` without `bench.y`)."""
    m = _COMPARISON.match(condition)
    if m and _FACT_NAME.match(m.group(3)) and m.group(3).lower() not in ("true", "false", "none", "null"):
        if m.group(3) not in facts:
            return ConditionResult(condition, "unknown", None, m.group(3))
        condition = f"{m.group(1)} {m.group(2)} {facts[m.group(3)]!r}"
    fact, op, expected = parse_condition(condition)
    actual = facts.get(fact, _MISSING)
    if actual is _MISSING:
        return ConditionResult(condition, "unknown", None, fact)
    if op in ("truthy", "falsy"):
        ok = bool(actual) if op == "truthy" else not actual
    else:
        if actual is None:  # a value the server left open: only its truthiness is known
            return ConditionResult(condition, "unknown", None, fact)
        ok = _compare(actual, op, expected)
    return ConditionResult(condition, "pass" if ok else "fail", actual, fact)


def check_all(conditions: list[str], facts: dict[str, Any]) -> list[ConditionResult]:
    """Evaluate every condition in order."""
    return [check(c, facts) for c in conditions]
