"""A verdict's certainty from how often its rule has been right (issue 53 item 1).

Each rule of `tools.research.verdict.decide.RULES` is counted on the taught labels per basis (what the
verdict rests on, `decide.BASES`): `cases` verdicts, `right` of them equal to the hand-read truth.
The certainty of a verdict of that rule on that basis is the mean of a Beta posterior,

    certainty = (right + PRIOR_RIGHT) / (cases + PRIOR_RIGHT + PRIOR_WRONG)

The prior, Beta(3, 1), is worth four cases at 0.75: a rule with no record is below the 0.9 that
reads as sure and above the 0.6 of an unsettled verdict; six right out of six lift it to 0.9, and
one wrong in twenty keeps it under 0.92. A verdict that rests on something the deployment's facts
did not settle (a guard left open at run time, a fact missing, a value only argument code reads)
says what (`CodeVerdict.unsettled`) and stays at or below `CAP` whatever its rule's record. An
`unknown` verdict claims nothing: its certainty is `UNKNOWN`.

The counts live in `calibration.toml` beside this module, with the rule, basis and outcome of every
taught case. `python benchmarks/bench_research.py --calibrate` rewrites it from the current labels
(never from a sealed file); tests/test_research_labels.py checks that each taught case is still
decided as recorded, and tests/test_research_calibration.py that the counts sum the cases and the
cases are the taught labels, so the file cannot drift from the labels or the code.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from functools import cache
from pathlib import Path

PRIOR_RIGHT = 3
PRIOR_WRONG = 1
CAP = 0.6
"""The most a verdict that rests on something unsettled may claim: `agent.policy.verdict.DOUBT`,
at or below which a rejection never rules a flag out."""
UNKNOWN = 0.3
COUNTS = Path(__file__).with_name("calibration.toml")
_HEADER = """\
# How often each rule of tools/research/verdict/decide.py has been right on the taught labels, by what the
# verdict rests on (tools/research/verdict/calibration.py says how a certainty comes from these counts).
# Written by `python benchmarks/bench_research.py --calibrate`; do not edit by hand.
"""


def key(rule: str, basis: str) -> str:
    """`reader-runs/guard`: the calibration key of a rule on one basis."""
    return f"{rule}/{basis}"


@cache
def _load(path: Path) -> tuple[dict[str, tuple[int, int]], dict[str, str], list[str]]:
    data = tomllib.loads(path.read_text()) if path.exists() else {}
    counts = {k: (int(v["cases"]), int(v["right"])) for k, v in data.get("rules", {}).items()}
    return counts, dict(data.get("cases", {})), list(data.get("files", []))


def counts(path: Path = COUNTS) -> dict[str, tuple[int, int]]:
    """`rule/basis` -> (cases, right), as committed."""
    return _load(path)[0]


def recorded_cases(path: Path = COUNTS) -> dict[str, str]:
    """Case id -> `rule/basis right|wrong`, as committed."""
    return _load(path)[1]


def label_files(path: Path = COUNTS) -> list[str]:
    """The label files the committed counts were taken from."""
    return _load(path)[2]


def share(cases: int, right: int) -> float:
    """The posterior mean of being right, from a record and the prior."""
    return (right + PRIOR_RIGHT) / (cases + PRIOR_RIGHT + PRIOR_WRONG)


def certainty(rule: str, basis: str, *, unsettled: str = "", verdict: str = "", path: Path = COUNTS) -> float:
    """The certainty of a verdict decided by `rule` on `basis` (two decimals): its record's share
    shrunk toward the prior, at most `CAP` when something is `unsettled`; `UNKNOWN` for unknown."""
    if verdict == "unknown":
        return UNKNOWN
    cases, right = counts(path).get(key(rule, basis), (0, 0))
    value = share(cases, right)
    return round(min(value, CAP) if unsettled else value, 2)


def tally(
    outcomes: Iterable[tuple[str, str, str, bool]],
) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """(case id, rule, basis, right) per case -> (counts per key, each case's record)."""
    per_key: dict[str, tuple[int, int]] = {}
    cases: dict[str, str] = {}
    for case_id, rule, basis, right in outcomes:
        k = key(rule, basis)
        n, r = per_key.get(k, (0, 0))
        per_key[k] = (n + 1, r + int(right))
        cases[case_id] = f"{k} {'right' if right else 'wrong'}"
    return dict(sorted(per_key.items())), cases


def render(files: list[str], per_key: dict[str, tuple[int, int]], cases: dict[str, str]) -> str:
    """The text of the counts file."""

    def q(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [_HEADER, "files = [" + ", ".join(q(f) for f in files) + "]", "", "[rules]"]
    for k, (n, r) in per_key.items():
        lines.append(f"{q(k)} = {{ cases = {n}, right = {r} }}  # certainty {share(n, r):.2f}")
    lines += ["", "[cases]"]
    lines += [f"{q(case_id)} = {q(record)}" for case_id, record in cases.items()]
    return "\n".join(lines) + "\n"


def write(files: list[str], outcomes: Iterable[tuple[str, str, str, bool]], path: Path = COUNTS) -> str:
    """Rewrite the counts file from the outcomes of the taught cases; returns its text."""
    text = render(files, *tally(outcomes))
    path.write_text(text)
    _load.cache_clear()
    return text
