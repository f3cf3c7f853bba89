"""A researcher's claims, checked by code before anyone sees or acts on its verdict.

- A flag that is not in the running version's catalog is `incompatible-with-version`, whatever
  the model says.
- Every cited `path:line` must exist in the version's source tree and quote that line; the others
  are dropped.
- `decided_by = "code"` only when the code's analysis (`tools.research.analysis`, run in this
  session) decided: a verdict the code did not reach is the model's (`decided_by = "model"`), and
  where the model and the code disagree the code decides and both are shown.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from agent.policy.builtin.research import decide_verdict
from agent.policy.proposal import in_catalog
from agent.policy.verdict import FlagVerdict

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{4,}")
"""A name or word of a quote, one of which must appear at (or within ten lines of) the cited line."""


def cited_line_problem(tree: Any, location: str, quote: str) -> str | None:
    """Why `location` (`path:line`) with `quote` is not a line of `tree` (None: it is)."""
    path, _, line = location.rpartition(":")
    if not path or not line.isdigit():
        return f"{location}: not a path:line"
    root = Path(tree.root).resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        return f"{location}: no such file in SGLang {tree.version}"
    lines = target.read_text(errors="replace").split("\n")
    n = int(line)
    if not 1 <= n <= len(lines):
        return f"{location}: the file has {len(lines)} lines"
    # a quote may be a help text, a call spread over the lines after the cited one, or the code's
    # own wording of an exit ("f calls g("): one of its names must be there
    words = set(_WORD.findall(quote))
    near = "\n".join(lines[max(0, n - 3) : n + 10])
    if words and not any(w in near for w in words):
        return f"{location}: the line does not say {quote.strip()[:60]!r}"
    return None


def check_claims(
    v: FlagVerdict, ctx: Any, code: dict[str, Any] | None, lookup: dict[str, Any]
) -> FlagVerdict:
    """`v` with its claims checked against the catalog, the tree and the code's analysis `code`
    (a `usage` result of this session, or None); `checked` lists what changed. `lookup` is the
    flag's `lookup` result (playbook prior) for a verdict the code has to replace."""
    said = f"{v.verdict} ({v.decided_by}, certainty {v.certainty:.2f})"
    v = v.model_copy(update={"checked": []})
    if in_catalog(ctx, v.flag) is False:
        if v.verdict != "incompatible-with-version" or v.decided_by != "code":
            v.checked.append(f"relabelled: the model said {said}; {v.flag} is not in the catalog")
        return v.model_copy(
            update={
                "verdict": "incompatible-with-version",
                "summary": f"{v.flag} is not a flag of SGLang {ctx.version}: the server would refuse to start."
                + (f" (The model said {said}: {v.summary})" if v.checked else ""),
                "decided_by": "code",
                "certainty": 1.0,
                "evidence": [],
            }
        )
    tree = getattr(ctx, "tree", None)
    if tree is not None:
        kept = []
        for e in v.evidence:
            problem = cited_line_problem(tree, e.location, e.quote)
            if problem:
                v.checked.append(f"evidence dropped: {problem}")
            else:
                kept.append(e)
        v.evidence = kept
    code_verdict = (code or {}).get("code_verdict")
    if not code_verdict or code_verdict == "unknown" or (code or {}).get("error"):
        if v.decided_by == "code":
            v.checked.append(f"relabelled: the model said {said}; the code's analysis did not decide it")
            v.decided_by = "model"
        return v
    # the code's verdict, with the playbook's rules where the code's reach ends (builtin/research.py)
    ours = FlagVerdict.model_validate(decide_verdict(v.flag, lookup, code))
    if v.verdict == ours.verdict:
        if v.decided_by != ours.decided_by:
            v.checked.append(f"relabelled: the model said {said}; the {ours.decided_by} decides it")
        return v.model_copy(update={"decided_by": ours.decided_by, "certainty": ours.certainty})
    ours.checked = [
        *v.checked,
        f"disagreement: the model said {said}; the {ours.decided_by} says {ours.verdict} and decides",
    ]
    ours.summary += f" (The model said {v.verdict}: {v.summary})"
    ours.lossy = ours.lossy or v.lossy
    ours.suggested_value = ours.suggested_value or v.suggested_value
    return ours
