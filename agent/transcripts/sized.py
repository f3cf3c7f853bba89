"""The response curve of a sized lever's search (`agent.policy.sizing`), as the report shows it:
every value tried alone, the value it was measured against (the one deployed then: a kept value
moves it), and each level's change with its 95% interval."""

from __future__ import annotations

from typing import Any

from tools.bench.effect import effect_of, pct


def searched(trials: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Flag -> its trials alone, in order, for each flag tried alone at two values or more."""
    by_flag: dict[str, list[dict[str, Any]]] = {}
    for t in trials:
        changes = t.get("changes") or []
        if t.get("kind", "single") == "single" and len(changes) == 1 and changes[0].get("value") is not None:
            by_flag.setdefault(changes[0]["flag"], []).append(t)
    return {f: ts for f, ts in by_flag.items() if len({t["changes"][0]["value"] for t in ts}) > 1}


def curve_lines(trials: list[dict[str, Any]]) -> list[str]:
    """`## Values searched`: one table per sized lever searched (markdown lines; [] for none)."""
    out = []
    for flag, ts in searched(trials).items():
        effects = [effect_of(t) for t in ts]
        levels = sorted({lv.concurrency for e in effects if e for lv in e.levels})
        head = "| trial | value | against | " + " | ".join(f"c={c}" for c in levels) + " | decision |"
        rows = [f"`{flag}`", "", head, "|" + "---:|" * (3 + len(levels)) + "---|"]
        against = "as deployed"
        for t, effect in zip(ts, effects, strict=True):
            value = t["changes"][0]["value"]
            at = (
                {lv.concurrency: pct(lv.ratio, lv.ci_low, lv.ci_high) for lv in effect.levels}
                if effect
                else {}
            )
            cells = " | ".join(at.get(c, "n/a") for c in levels)
            decision = str(t.get("decision", "")).replace("_", " ")
            rows.append(f"| {t.get('number')} | {value} | {against} | {cells} | {decision} |")
            if t.get("decision") == "kept":
                against = value
        out += [*rows, ""]
    if not out:
        return []
    return [
        "## Values searched",
        "",
        "Each value of a sized lever, tried alone against the value deployed then; the change per level",
        "with its 95% interval. The search stops when no value left could beat the best by the minimum",
        "effect, the curve being concave along its ladder.",
        "",
        *out,
    ]
