"""The builtin researcher's rules: a `FlagVerdict` from the catalog, the playbook and the code search."""

from __future__ import annotations

from typing import Any


def _conditions(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for c in checks:
        fact = c.get("fact")
        if fact is None:  # a playbook condition: {"condition", "actual", "outcome"}
            fact = f"{c['condition'].split()[0]} = {c.get('actual')!r}"
        out.append({"condition": c["condition"], "fact": fact, "outcome": c["outcome"]})
    return out


_VALIDATORS = ("check_", "_check_", "validate", "_validate")


def _is_validation(reader: dict[str, Any]) -> bool:
    return str(reader.get("function") or "").startswith(_VALIDATORS)


def decide_verdict(flag: str, lookup: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """The verdict, in order: not in this version → incompatible; a playbook conflict → incompatible;
    never read → dead; every reader's guard fails here → no-op; a playbook need fails → no-op;
    a reader whose conditions hold → applies; no code evidence → unknown."""
    playbook = lookup.get("playbook") or {}
    version = lookup.get("sglang_version") or "?"
    evidence: list[dict[str, str]] = []
    conditions = _conditions(playbook.get("needs", []) + playbook.get("conflicts", []))
    base = {
        "flag": flag,
        "expected_effect": playbook.get("helps", ""),
        "risk": playbook.get("risk", ""),
        "lossy": bool(playbook.get("lossy", False)),
        "suggested_value": playbook.get("value"),
    }
    if usage.get("definition"):  # the definition first, then every reader
        evidence.append(
            {
                "location": usage["definition"],
                "quote": str(usage.get("help") or usage["dest"]),
                "why": "definition",
            }
        )

    def verdict(kind: str, summary: str) -> dict[str, Any]:
        return {**base, "verdict": kind, "summary": summary, "evidence": evidence, "conditions": conditions}

    all_readers = usage.get("readers", [])
    # A reader inside a compatibility check only refuses combinations; it does not make the flag act.
    checks_only = [r for r in all_readers if _is_validation(r)]
    readers = [r for r in all_readers if not _is_validation(r)]
    live = []
    for r in readers:
        evidence.append({"location": r["location"], "quote": r["text"], "why": "reader"})
        conditions.extend(_conditions(r.get("checks", [])))
        if not any(c["outcome"] == "fail" for c in r.get("checks", [])):
            live.append(r)
    for r in checks_only:
        evidence.append(
            {"location": r["location"], "quote": r["text"], "why": f"compatibility check in {r['function']}"}
        )
    if lookup.get("in_catalog") is False:
        return verdict(
            "incompatible", f"{flag} is not a flag of SGLang {version}: the server would refuse to start."
        )
    conflicts = [c for c in playbook.get("conflicts", []) if c["outcome"] == "pass"]
    if conflicts:
        why = "; ".join(f"{c['condition']} (actual {c['actual']!r})" for c in conflicts)
        return verdict("incompatible", f"conflicts with this deployment: {why}.")
    if "error" in usage or not usage:
        needs_fail = [c for c in playbook.get("needs", []) if c["outcome"] == "fail"]
        if needs_fail:
            return verdict("no-op", f"playbook condition fails here: {needs_fail[0]['condition']}.")
        return verdict("unknown", f"no code evidence ({usage.get('error', 'no usage data')}).")
    if usage.get("dead") or not all_readers:
        return verdict(
            "dead", f"{flag} is defined in SGLang {version} but nothing reads `{usage.get('dest')}`."
        )
    if not readers:
        where = checks_only[0]["location"]
        return verdict("no-op", f"{flag} is read only by compatibility checks ({where}); nothing acts on it.")
    if not live:
        failing = next(c for r in readers for c in r["checks"] if c["outcome"] == "fail")
        return verdict(
            "no-op",
            f"every reader is guarded by a condition that fails here, e.g. {failing['condition']} "
            f"with {failing['fact']} ({readers[0]['location']}).",
        )
    needs_fail = [c for c in playbook.get("needs", []) if c["outcome"] == "fail"]
    if needs_fail:
        c = needs_fail[0]
        return verdict(
            "no-op", f"read by the code, but it needs {c['condition']} and here it is {c['actual']!r}."
        )
    passing = [c for r in live for c in r.get("checks", []) if c["outcome"] == "pass"]
    held = "; ".join(f"{c['condition']} with {c['fact']}" for c in passing[:3])
    summary = f"read at {live[0]['location']}" + (f"; conditions hold: {held}" if held else "") + "."
    if usage.get("deprecated"):
        summary += f" Deprecated in {version}" + (
            f", replaced by {usage['replacement']}." if usage.get("replacement") else "."
        )
    return verdict("applies", summary)
