"""Values SGLang refuses as soon as it parses them, refused before any restart.

`--tp-size 0` or `--dp-size -5` type-check as integers, so the flag catalog lets them through; the
server then dies at start-up, which costs a restart into it and another one to roll back. These are
the numeric flags whose range is fixed whatever the model or hardware (a fraction, a count of
GPUs, nodes, pages or requests, a port); a value that is not a plain number (`${TP}`) is left to
the catalog check and to the server.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["BOUNDS", "value_problems"]

_ONE_OR_MORE = (
    "--tp-size", "--tensor-parallel-size", "--dp-size", "--data-parallel-size", "--pp-size",
    "--pipeline-parallel-size", "--ep-size", "--expert-parallel-size", "--nnodes", "--page-size",
    "--max-running-requests", "--cuda-graph-max-bs",
)  # fmt: skip
BOUNDS: dict[str, tuple[type, float, float, str]] = {
    **{flag: (int, 1, float("inf"), "an integer of at least 1") for flag in _ONE_OR_MORE},
    "--mem-fraction-static": (float, 1e-9, 1.0, "a fraction above 0 and at most 1"),
    "--port": (int, 1, 65535, "a port number from 1 to 65535"),
}
"""flag: (type, lowest, highest, what it must be)."""


def _number(kind: type, value: str) -> float | None:
    try:
        return kind(value)
    except ValueError:
        return None


def value_problems(flags: Mapping[str, str | None]) -> list[str]:
    """One message per flag whose value SGLang would refuse at parse time (empty: none)."""
    problems = []
    for flag, value in flags.items():
        bound = BOUNDS.get(flag)
        if bound is None or value is None:
            continue
        kind, low, high, what = bound
        number = _number(kind, value.strip())
        if number is None:
            if kind is int and _number(float, value.strip()) is not None:
                problems.append(f"{flag} must be {what}, got {value!r}")
            continue  # not a plain number: left to the catalog's type check
        if not low <= number <= high:
            problems.append(f"{flag} must be {what}, got {value}; SGLang would refuse it at start-up")
    return problems
