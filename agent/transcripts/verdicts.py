"""How research verdicts read in a review: evidence with full paths, condition checks counted.

A verdict may carry dozens of conditions whose outcome is `unknown`; listing them all made the HTML
export tens of thousands of pixels tall. The review shows counts and the conditions that decided
something; the HTML export keeps the full lists, collapsed.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "CONDITIONS_MARKER", "TODO_MARKER", "condition_outcome", "condition_summary", "evidence_lines",
    "plain_condition",
]  # fmt: skip

QUOTE_LIMIT = 120
CONDITIONS_MARKER = "OPTAGENT-CONDITION-DETAILS"
"""A paragraph `export_html` replaces with the full, collapsed condition lists."""
TODO_MARKER = "OPTAGENT-TODO-DETAILS"
"""A paragraph `export_html` replaces with the todo list's evolution, collapsed."""


def condition_outcome(text: str) -> str:
    """`pass`, `fail` or `unknown` for one rendered condition (`cond vs fact: outcome`)."""
    word = text.rsplit(":", 1)[-1].strip().lower()
    if word in ("pass", "passed", "true", "holds", "ok", "yes"):
        return "pass"
    if word in ("fail", "failed", "false", "no", "violated", "does not hold"):
        return "fail"
    return "unknown"


_NAME = r"[A-Za-z_][\w.]*"
_NEGATED = {"not in": "in", "in": "not in", "!=": "==", "==": "!=", "is not": "is", "is": "is not"}
_WORDS = {"pass": "holds", "fail": "does not hold", "unknown": "not known"}


def _simplify(cond: str) -> str:
    """A code condition as a person writes it: `not not x` is `x`, `not a in b` is `a not in b`,
    `not server.x` is `server.x is off`, `cfg.x` is `server.x`."""
    text = re.sub(r"\b(?:cfg|view|self\.server_args|server_args)\.", "server.", cond.strip())
    while text.startswith("not not "):
        text = text[8:]
    m = re.fullmatch(rf"not ({_NAME}) (not in|in|!=|==|is not|is) (.+)", text)
    if m:
        text = f"{m[1]} {_NEGATED[m[2]]} {m[3]}"
    m = re.fullmatch(rf"({_NAME}) (is not|is) None", text)
    if m:
        return f"{m[1]} is {'set' if m[2] == 'is not' else 'unset'}"
    if re.fullmatch(rf"not {_NAME}", text):
        return f"{text[4:]} is off"
    if re.fullmatch(_NAME, text):
        return f"{text} is on"
    return text


def plain_condition(condition: str, fact: str, outcome: str) -> str:
    """`server.disable_cuda_graph is off (here False): holds` — the condition simplified, the
    deployment's value, and whether it holds (never `not x vs not = False: pass`)."""
    name, sep, value = str(fact).partition(" = ")
    if not sep:
        here = str(fact) or "?"
    elif name in ("not", "") or name.split(".")[-1] in condition:
        here = value
    else:
        here = f"{name} = {value}"
    return f"{_simplify(condition)} (here {here}): {_WORDS.get(outcome, outcome)}"


def condition_summary(conditions: list[str], *, failures: int = 2) -> str:
    """`40 checked: 1 fail, 1 pass, 38 unknown; fails: X vs Y: fail` — counts, then up to `failures` of
    the failed checks (what can stop a flag from applying here)."""
    if not conditions:
        return "none recorded"
    counts: dict[str, int] = {}
    for c in conditions:
        counts[condition_outcome(c)] = counts.get(condition_outcome(c), 0) + 1
    text = f"{len(conditions)} checked: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    failed = [c for c in conditions if condition_outcome(c) == "fail"][:failures]
    return text + ("; fails: " + "; ".join(failed) if failed else "")


def evidence_lines(verdict: dict[str, Any], *, limit: int = 3) -> list[str]:
    """A verdict's evidence as Markdown bullets with the full `path:line` (never cut)."""
    lines = []
    for ev in verdict["evidence"][:limit]:
        where, _, quote = ev.partition(" ")
        quote = quote if len(quote) <= QUOTE_LIMIT else quote[: QUOTE_LIMIT - 1] + "…"  # the path stays whole
        lines.append(f"- {verdict['flag']}: `{where}` {quote}".rstrip())
    return lines or [f"- {verdict['flag']}: no evidence recorded"]
