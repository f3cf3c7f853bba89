"""The builtin planner's written conclusion, built only from tool results (every number measured)."""

from __future__ import annotations

from typing import Any

from agent.policy.verdict import final_rejection


def _levels(t: dict[str, Any]) -> str:
    """Per level what the decision compared (known-good vs candidate blocks, the change with its
    95% interval); a trial without a decision: its tok/s against the run's first baseline."""
    if t.get("decided"):
        return ", ".join(f"c={c}: {v}" for c, v in t["decided"].items())
    base, now = t.get("baseline_output_tok_s") or {}, t.get("output_tok_s") or {}
    parts = []
    for c, v in now.items():
        b = base.get(c) or base.get(str(c))
        parts.append(f"c={c}: {v:.0f} tok/s" + (f" ({(v / b - 1) * 100:+.1f}%)" if b else ""))
    return ", ".join(parts) or "not measured"


def _together(t: dict[str, Any]) -> str:
    """`, tried together: one effect for all` for a trial of several flags as one change."""
    if t.get("kind") in ("bundle", "combined") and len(t.get("changes") or []) > 1:
        return ", tried together: one effect for all, no member's own"
    return ""


def conclusion(
    cands: list[dict[str, Any]],
    verdicts: dict[str, dict[str, Any]],
    trials: dict[str, dict[str, Any]],
    combined: dict[str, Any] | None,
    budget_out: str | None,
    untried: dict[str, int] | None = None,
    earlier: list[dict[str, Any]] | None = None,
    unresearched: dict[str, str] | None = None,
) -> str:
    """Markdown: what was kept with its numbers, what was rolled back and why, what was ruled out,
    and which candidates were never tried and why (`untried`: flag -> rank by expected value;
    `unresearched`: flag -> why it has no verdict, the deadline having come first).
    `trials`: each flag's latest trial; `earlier`: the first trials of flags given a second look.
    One piece because it writes one Markdown document section by section, in the order it is read."""
    seen: set[Any] = set()  # a bundle is each member's trial: listed once
    singles = []
    for t in sorted([*(earlier or []), *trials.values()], key=lambda t: t.get("trial") or 0):
        if t.get("trial") is None or t["trial"] not in seen:
            singles.append(t)
            seen.add(t.get("trial"))
    all_trials = [*singles, *([combined] if combined else [])]
    kept = [t for t in all_trials if t.get("decision") == "kept"]
    best = kept[-1] if kept else None
    lines = ["## Conclusion", ""]
    if best:
        lines.append(
            f"Deployed: {', '.join(best.get('deployed') or best['changes'])} (trial {best['trial']}{_together(best)}): "
            f"{best.get('headline') or best['decision']}; per level, over what was deployed before it: "
            f"{_levels(best)}."
        )
        if len(kept) > 1:
            earlier = "; ".join(f"{', '.join(t['changes'])} (trial {t['trial']}): {t.get('headline') or 'kept'}"
                                for t in kept[:-1])  # fmt: skip
            lines.append(f"Kept before it, each its own effect then: {earlier}.")
    elif any(t.get("dry_run") for t in all_trials):
        lines.append("Dry run: nothing was deployed; the trials below are what a real run would try.")
    else:
        lines.append("No change beat the baseline; the baseline configuration stays deployed.")
    lines += ["", "### Trials"]
    for t in all_trials:
        if t.get("dry_run"):
            lines.append(f"- would trial {t.get('would_trial')}")
        elif "error" in t:
            lines.append(f"- not run: {t['error']}")
        else:
            lines.append(
                f"- trial {t['trial']} {', '.join(t['changes'])}{_together(t)}: {t['decision'].replace('_', ' ')} — "
                f"{t['why']} [{_levels(t)}]"
            )
    if not all_trials:
        lines.append("- none")
    lines += ["", "### Ruled out without a restart"]
    ruled = 0
    for c in cands:
        v = verdicts.get(c["flag"])
        if c["flag"] in trials or c["flag"] in (untried or {}):
            continue  # the code overruled a playbook rule: listed under Trials or Not tried
        if final_rejection(v):
            ev = v["evidence"][0]["location"] if v.get("evidence") else "no evidence"
            lines.append(f"- {c['flag']}: {v['verdict']} — {v['summary']} ({ev})")
            ruled += 1
        elif c["status"] != "candidate":
            lines.append(f"- {c['flag']}: ruled out ({c.get('ruled_out') or c['note']})")
            ruled += 1
    if not ruled:
        lines.append("- none")
    lines += ["", "### Not tried"]
    for flag, why in (unresearched or {}).items():
        lines.append(f"- {_label(cands, flag)}: {why}")
    if untried:
        why = budget_out or "the planner stopped"
        for flag, rank in untried.items():
            lines.append(f"- {_label(cands, flag)}: {why} (rank {rank} by expected value per restart)")
    elif not unresearched:
        lines.append("- none: every candidate worth a restart was tried")
    return "\n".join(lines)


def _label(cands: list[dict[str, Any]], flag: str) -> str:
    """`flag value` as the playbook gives the candidate (the flag alone when it has no value)."""
    c = next((c for c in cands if c["flag"] == flag), {"value": None})
    return flag if c.get("value") is None else f"{flag} {c['value']}"
