"""The builtin policy's answer to "what would you try first, and why?": one first pick and its
reason, then a few next ones, in the order a run would trial them (`builtin.trial_queue`: research
certainty x plausible gain / restart cost, `agent.policy.order`).

A run researches every candidate before it orders them; a question should not wait for that. Only
the candidates that could still come first are researched: those whose value, were research sure
it applies, would beat the best value research has given so far (`could_come_first`), a few at a
time, until none is left that could.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from agent.policy.builtin.policy import live_candidates, lossy_blocked, trial_queue
from agent.policy.order import certainty, expected_value, plausible_gain, restart_cost
from agent.policy.verdict import final_rejection
from tools.flagname import flag_name

RESEARCH_AT_ONCE = 3
"""Candidates researched in one step while looking for the first pick."""
NEXT_SHOWN = 3
"""Next picks named after the first."""
SURE = {"verdict": "applies", "certainty": 1.0}
"""The best research could say of a candidate: its value then bounds what it can be worth."""


def value_of(entry: dict[str, Any], verdicts: dict[str, Any]) -> float:
    """The value per restart the run's order gives `entry` (a bundle: its members' values added, over
    the slowest member's restart cost, as `agent.policy.trialqueue` values one)."""
    members = entry.get("bundle") or [entry]
    total = sum(expected_value(m, verdicts.get(m["flag"])) * restart_cost(m) for m in members)
    return total / max(restart_cost(m) for m in members)


def could_come_first(
    cands: list[dict[str, Any]],
    verdicts: dict[str, Any],
    tried: dict[str, list[dict[str, Any]]],
    attempted: set[str],
    slots: float | None = None,
) -> list[str]:
    """The flags to research before answering: untried, unresearched (and not `attempted` in vain
    this turn) candidates that, were research sure of them, would beat the best so far; the likeliest
    first, at most `RESEARCH_AT_ONCE`."""
    queue = trial_queue(cands, verdicts, tried, slots)
    best = value_of(queue[0][0], verdicts) if queue else 0.0
    open_ = [
        c
        for c in live_candidates(cands)
        if c["flag"] not in verdicts
        and c["flag"] not in tried
        and c["flag"] not in attempted
        and not lossy_blocked(c, None)
    ]
    beat = sorted(
        (c for c in open_ if expected_value(c, SURE) > best), key=lambda c: -expected_value(c, SURE)
    )
    return [c["flag"] for c in beat[:RESEARCH_AT_ONCE]]


def _change(c: dict[str, Any]) -> str:
    if "bundle" in c:
        return " + ".join(_change(m) for m in c["bundle"])
    if c.get("action") == "unset":
        return f"unset {c['flag']}"
    return c["flag"] if c.get("value") is None else f"{c['flag']} {c['value']}"


def _request(c: dict[str, Any]) -> str:
    """What a user types in chat to trial the single candidate `c`."""
    return _change(c) if c.get("action") == "unset" else f"try {_change(c)}"


def _first_sentence(text: str, limit: int = 200) -> str:
    head = text.split(". ")[0].rstrip(".")
    return head if len(head) <= limit else head[: limit - 3] + "..."


def _reason(
    entry: dict[str, Any], why: str, verdicts: dict[str, Any], value: float, shown: Collection[str]
) -> str:
    """Why `entry` comes first: research's verdict, the playbook's case for it, and its value."""
    if "bundle" in entry:
        return f"Why: {why}; together an expected +{value:.1%} for one trial, the order a run uses"
    v = verdicts.get(entry["flag"]) or {}
    said = f"research says '{v.get('verdict')}' ({v.get('decided_by', 'code')}, certainty {certainty(v):.2f})"
    if entry["flag"] in shown:  # its verdict was printed just above: not repeated
        said += ", its evidence above"
    elif v.get("summary"):
        said += f": {_first_sentence(str(v['summary']))}"
    helps = str(entry.get("helps") or "").rstrip(".")
    gain, cost = plausible_gain(entry), restart_cost(entry)
    where = f"; {'; '.join(entry['state_why'])}" if entry.get("state_why") else ""
    case = (
        f" The playbook: {helps[:1].lower() + helps[1:]} (about +{gain:.1%} where it acts{where})."
        if helps
        else ""
    )
    again = f" ({why})" if why not in ("untried", "") else ""
    return (
        f"Why: {said}.{case} Its expected gain per trial is the highest of what is open{again}: "
        f"{certainty(v):.2f} x +{gain:.1%} / {cost:g} trial{'s' * (cost != 1)} = +{value:.1%}, the order a run uses"
    )


def first_pick_text(
    cands: list[dict[str, Any]],
    verdicts: dict[str, Any],
    tried: dict[str, list[dict[str, Any]]],
    slots: float | None = None,
    *,
    shown: Collection[str] = (),
    failed: Collection[str] = (),
) -> str:
    """One first pick with its reason, then at most `NEXT_SHOWN` next ones (the unresearched among
    them with the most they could be worth), and how to run the first. `shown`: flags whose verdict
    was just printed (the reason does not repeat its summary); `failed`: flags whose research was
    asked for and gave no verdict (said, since one of them could have come first). One piece
    because it writes one message line by line, in the order it is read, from one trial queue."""
    queue = trial_queue(cands, verdicts, tried, slots)
    ruled_out = [c["flag"] for c in live_candidates(cands) if final_rejection(verdicts.get(c["flag"]))]
    failed = [f for f in failed if f not in verdicts]
    unsettled = (
        f"Research of {', '.join(failed)} failed (why is above): 'research {failed[0]}' again before "
        "trusting this order."
        if failed
        else ""
    )
    if not queue:
        out = ["nothing is left worth a trial here"]
        if ruled_out:
            out.append(f"research ruled out {', '.join(ruled_out)}")
        return (
            "; ".join(out)
            + " ('list the candidates' says why for each)"
            + (f"\n{unsettled}" if failed else "")
        )
    (first, why), rest = queue[0], queue[1:]
    value = value_of(first, verdicts)
    lines = [f"First: {_change(first)}.", f"{_reason(first, why, verdicts, value, shown)}."]
    nexts = [(value_of(c, verdicts), f"{_change(c)} (+{value_of(c, verdicts):.1%})") for c, _ in rest]
    unresearched = [
        c
        for c in live_candidates(cands)
        if c["flag"] not in verdicts and c["flag"] not in tried and not lossy_blocked(c, None)
    ]
    nexts += [
        (
            expected_value(c, SURE),
            f"{_change(c)} (not researched yet, at most +{expected_value(c, SURE):.1%})",
        )
        for c in unresearched
    ]
    nexts.sort(key=lambda x: -x[0])
    if nexts:
        more = f"; {len(nexts) - NEXT_SHOWN} more" if len(nexts) > NEXT_SHOWN else ""
        lines.append("Next: " + "; ".join(text for _, text in nexts[:NEXT_SHOWN]) + more + ".")
    if ruled_out:
        lines.append(f"Ruled out by research: {', '.join(ruled_out)}.")
    if unsettled:
        lines.append(unsettled)
    run = (
        "'improve throughput' runs them in this order"
        if "bundle" in first
        else f"'{_request(first)}' runs it"
    )
    lines.append(f"{run}; 'list the candidates' shows every one.")
    return "\n".join(lines)


def tried_flags(returns: list[tuple[str, Any, dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Flag -> the trial results that tried it (`run_trial` returns; each member of a bundle)."""
    tried: dict[str, list[dict[str, Any]]] = {}
    for name, content, args in returns:
        if name != "run_trial" or not isinstance(content, dict) or "trial" not in content:
            continue
        for change in args.get("changes") or []:
            flag = flag_name(str(change.get("flag", "")))
            tried.setdefault(flag, []).append(content)
    return tried
