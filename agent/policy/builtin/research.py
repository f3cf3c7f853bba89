"""The builtin researcher's rules: a `FlagVerdict` from the code's verdict, with the playbook as a prior.

The code decides whenever it can (`tools.research.analysis`): not in this version, refuses to start, dead,
no-op, applies. The playbook only decides when the code leaves the question open (`unknown`, or no
source tree), and such a verdict is labelled `decided_by = "playbook"`. Where a playbook rule and
the code disagree, the code wins and the summary says which rule was overruled, except where the
code could not settle it: a playbook refusal stands against "applies", and so does a playbook no-op
decided on a fact against an "applies" at certainty <= DOUBT.
"""

from __future__ import annotations

from typing import Any

from agent.policy.verdict import DOUBT


def _conditions(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for c in checks:
        fact = c.get("fact")
        if fact is None:  # a playbook condition: {"condition", "actual", "outcome"}
            fact = f"{c['condition'].split()[0]} = {c.get('actual')!r}"
        out.append({"condition": c["condition"], "fact": fact, "outcome": c["outcome"]})
    return out


def _evidence(usage: dict[str, Any]) -> list[dict[str, str]]:
    """The definition, then readers that decide (on/runtime first), then exits that fire."""
    out: list[dict[str, str]] = []
    if usage.get("definition"):
        out.append(
            {
                "location": usage["definition"],
                "quote": str(usage.get("help") or usage.get("dest")),
                "why": "definition",
            }
        )
    order = {"on": 0, "runtime": 1, "unknown": 2, "off": 3}
    for r in sorted(usage.get("readers", []), key=lambda r: order.get(r.get("state", ""), 4)):
        out.append(
            {"location": r["location"], "quote": r["text"], "why": f"reader ({r['state']}): {r['why']}"}
        )
        for e in r.get("exits", []):
            if e.get("fires") is True:
                out.append(
                    {
                        "location": e["location"],
                        "quote": e["message"],
                        "why": f"{e['kind']} reached from {r['location']}",
                    }
                )
    return out


def _playbook_opinion(playbook: dict[str, Any]) -> tuple[str, str] | None:
    """What the playbook alone would say: a conflict that holds, or a need that fails."""
    conflicts = [c for c in playbook.get("conflicts", []) if c["outcome"] == "pass"]
    if conflicts:
        why = "; ".join(f"{c['condition']} (actual {c.get('actual')!r})" for c in conflicts)
        return "refuses-to-start", f"the playbook says it conflicts with this deployment: {why}"
    needs = [c for c in playbook.get("needs", []) if c["outcome"] == "fail"]
    if needs:
        c = needs[0]
        return "no-op", f"the playbook says it needs {c['condition']} and here it is {c.get('actual')!r}"
    return None


def decide_verdict(flag: str, lookup: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """The verdict: the code's, unless it is unknown; then the playbook's rule, labelled as such."""
    playbook = lookup.get("playbook") or {}
    version = lookup.get("sglang_version") or "?"
    conditions = _conditions(playbook.get("needs", []) + playbook.get("conflicts", []))
    for r in usage.get("readers", []):
        conditions.extend(_conditions(r.get("checks", [])))
    base = {
        "flag": flag,
        "expected_effect": playbook.get("helps", ""),
        "risk": playbook.get("risk", ""),
        "lossy": bool(playbook.get("lossy", False)),
        "suggested_value": playbook.get("value"),
        "evidence": _evidence(usage),
        "conditions": conditions,
    }

    def verdict(kind: str, summary: str, decided_by: str, certainty: float) -> dict[str, Any]:
        return {**base, "verdict": kind, "summary": summary, "decided_by": decided_by, "certainty": certainty}

    if lookup.get("in_catalog") is False:
        return verdict(
            "incompatible-with-version",
            f"{flag} is not a flag of SGLang {version}: the server would refuse to start.",
            "code",
            1.0,
        )
    code = usage.get("code_verdict")
    prior = _playbook_opinion(playbook)
    if code and code != "unknown":
        summary = usage.get("code_summary", "")
        if usage.get("researched_as"):
            summary += f" (researched as {usage['researched_as']}, its replacement)"
        if prior is not None and prior[0] == "refuses-to-start" and code == "applies":
            # not finding a refusal within a bounded reach is no proof there is none (kernels,
            # libraries): the playbook's refusal stands, labelled as the playbook's alone
            why = f"{prior[1]}; the code found no refusal within its reach ({summary})"
            return verdict("refuses-to-start", why + " (playbook rule alone)", "playbook", 0.5)
        certainty = float(usage.get("certainty", 0.8))
        if prior is not None and prior[0] == "no-op" and code == "applies" and certainty <= DOUBT:
            # an "applies" the code could not settle does not overrule a rule decided on a fact
            why = f"{prior[1]}; the code could not settle it ({summary})"
            return verdict("no-op", why + " (playbook rule)", "playbook", 0.5)
        if prior is not None and prior[0] != code:
            summary += f" The code overrules the playbook here: {prior[1]}."
        return verdict(code, summary, "code", certainty)
    why_open = usage.get("code_summary") or usage.get("error") or "no code evidence"
    if prior is not None:
        return verdict(
            prior[0],
            f"{prior[1]} (playbook rule alone; the code leaves it open: {why_open})",
            "playbook",
            0.5,
        )
    return verdict("unknown", f"the code leaves it open: {why_open}", "unknown", 0.3)
