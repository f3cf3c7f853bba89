"""What the builtin planner trials next: the candidates ranked by value per restart
(`agent.policy.order`), with near misses, small levers and what the budget cannot reach grouped.

A change rejected on its first launch that the numbers did not rule out, research sure of it, gets
one more look valued by what that launch measured (`another_looks`): mostly ranked after what is
untried, it spends restarts a run would leave unspent, and its decision pools the first launch in.

A near miss (rejected as not established although it still looked like a winner) may get one
second look, ranked with the untried candidates: its certainty is the chance, given what was
measured, that it helps at all, its plausible gain the estimate measured. Near misses that came
nearest at the same level get theirs as one change (`second_looks`): what was measured says each is
small there, and together their gains add at that level; a bundle that came near is tried again
whole.

Small levers are tried together: a candidate whose plausible gain is below what one trial can
establish with this deployment's restart spread (`establishable`) would be "not established" alone
however real, so the untried small ones go into one change (`plan_bundle`), ranked by the sum of
their values for one restart. A kept bundle is then pruned of its doubtful members
(`doubtful_members`: low certainty, or no mechanism at the level that won), each left out in a
trial of its own (`agent.trial.prune`); a bundle that regressed gives each member research is sure
of one trial alone (one member's cost hides the others' gains).

The budget is counted too: when more candidates are open than the trials the budget still fits (the
runner's `trials_left`, in every trial result), the ones research is sure enough of that would not
be reached go into one change in the last slot (`fit_budget`), rather than not being tried at all.

A sized lever tried alone comes back at its next value while its search is not over
(`sized_steps`, `agent.policy.sizing`), valued by the most that value may gain.
"""

from __future__ import annotations

from typing import Any

from agent.policy.order import (
    GAIN_BY_PRIORITY,
    PLAYBOOK_DOUBTS,
    certainty,
    expected_value,
    log_estimate,
    plausible_gain,
    restart_cost,
    second_look_value,
)
from agent.policy.sizing import Ladder, next_size
from agent.trial.firstlook import look_value
from tools.bench.paired import Interval

RETRY_SHARE = 0.8
"""A trial the machine disturbed (known-good moved beyond its spread), or a sure member of a bundle
that regressed, is tried once more, at this share of its untried value (it spent a restart or two
without an answer)."""
DOUBTFUL_CERTAINTY = 0.5
"""A bundle member research is less sure of than this is left out unless it proves itself."""


def second_looks(
    candidates: list[dict[str, Any]], tried: dict[str, list[dict[str, Any]]]
) -> list[tuple[float, int, dict[str, Any], str]]:
    """(value, index, candidate, why) of one second look per level: the near misses tried once
    whose best judged level is the same go into one change. Alone each is a gain one trial could
    not establish at that level; their gains add there, so one trial of them together is likelier
    to establish it, for one trial's restarts instead of one each. A bundle that came near is tried
    again whole (its members share one result), not one member at a time at the bundle's value."""
    groups: dict[Any, list[tuple[int, dict[str, Any], dict[str, Any]]]] = {}
    for i, c in enumerate(candidates):
        results = tried.get(c["flag"], [])
        if len(results) == 1 and not results[0].get("disturbed") and (miss := results[0].get("near_miss")):
            groups.setdefault(miss.get("concurrency"), []).append((i, c, results[0]))
    out = []
    for level, group in groups.items():
        if len(group) == 1:
            i, c, result = group[0]
            out.append((second_look_value(c, result["near_miss"]), i, c, "second look at a near miss"))
            continue
        misses = {(r.get("trial"), repr(r["near_miss"])): r["near_miss"] for _, _, r in group}
        members = [c for _, c, _ in group]
        cost = max(restart_cost(c) for c in members)
        value = look_value([log_estimate(m) for m in misses.values()], cost)
        parts = ", ".join(f"{m['ratio'] - 1:+.1%}" for m in misses.values())
        names = ", ".join(c["flag"] for c in members)
        why = (
            f"second look together: {names} came near at c={level} ({parts} in {len(misses)} "
            "trials); their gains add there"
            if len(misses) > 1
            else f"second look at a bundle that came near: {names} at c={level} ({parts})"
        )
        entry = {"flag": " + ".join(c["flag"] for c in members), "bundle": members, "together": why}
        out.append((value, min(i for i, _, _ in group), {**entry, "second_look": True}, why))
    return out


def another_looks(
    candidates: list[dict[str, Any]], verdicts: dict[str, Any], tried: dict[str, list[dict[str, Any]]]
) -> list[tuple[float, int, dict[str, Any], str]]:
    """(value, index, candidate, why) of one more look at each candidate research is sure enough of
    (`_sure_enough`) whose only trial, alone, ended on its first launch without the numbers ruling
    it out (`first_look`). The look runs on the changes kept by then and is judged together with
    that first launch (`agent.trial.firstlook`). Valued, as a near miss is, by what that launch
    measured: below the bar of a likely winner, so it mostly ranks after what is untried and takes
    restarts the run would otherwise leave unspent."""
    out = []
    for i, c in enumerate(candidates):
        rs = tried.get(c["flag"], [])
        if len(rs) != 1 or rs[0].get("kind") != "single" or not (look := rs[0].get("first_look")):
            continue
        if not _sure_enough(c, verdicts):
            continue
        value = look_value([log_estimate(look)], restart_cost(c))
        measured = Interval.model_validate(look).pct()
        why = f"another look, judged with its first launch (c={look.get('concurrency')} {measured} did not rule it out)"
        out.append((value, i, c, why))
    return out


def _sunk_by_its_bundle(results: list[dict[str, Any]]) -> str | None:
    """Tried only in one bundle, which regressed or failed to start: the cost (a cache lever's on
    shared prefixes, say) or the refusal may be any member's, so a member research is sure of has
    not been judged (`next_trials` gives it one trial alone; it is never bundled again). Returns
    what happened to the bundle, or None."""
    if len(results) != 1 or results[0].get("kind") != "bundle":
        return None
    if results[0].get("verdict") == "regressed":
        return "regressed"
    return "failed to start" if results[0].get("failed_start") else None


def _open(results: list[dict[str, Any]]) -> bool:
    """Untried, or tried once in a trial the machine disturbed."""
    return not results or (len(results) == 1 and bool(results[0].get("disturbed")))


def plan_bundle(
    candidates: list[dict[str, Any]], verdicts: dict[str, Any], tried: dict[str, list[dict[str, Any]]]
) -> tuple[list[dict[str, Any]], str] | None:
    """(the untried small candidates to try as one change, why), or None when fewer than two are
    small at one level. A candidate is small when its plausible gain is below its `establishable`
    figure; one the playbook doubts, whose mechanism acts at no measured level, or that is known to
    cost at a measured level (`costs_at_levels`: a loss there beyond the tolerance would sink the
    others) is left out (alone at the end of the queue it costs only what it is worth). The members
    act at one level (`acts_at_levels`; unknown: every level), the one where the most value is
    small: gains add only where they show together, and a member acting elsewhere would only be
    left out again."""
    small = [
        c
        for c in candidates
        if _open(tried.get(c["flag"], []))
        and c.get("establishable")
        and plausible_gain(c) < c["establishable"]
        and c.get("status") not in PLAYBOOK_DOUBTS
        and c.get("acts_at_levels") != []
        and not c.get("costs_at_levels")
        and certainty(verdicts.get(c["flag"])) > 0
    ]
    levels = {lv for c in small for lv in c.get("acts_at_levels") or []}
    at = {
        lv: [c for c in small if c.get("acts_at_levels") is None or lv in c["acts_at_levels"]]
        for lv in levels
    }
    level, small = max(
        at.items() or [(None, small)],
        key=lambda kv: (
            sum(expected_value(c, verdicts.get(c["flag"])) for c in kv[1]),
            len(kv[1]),
            kv[0] or 0,
        ),
    )
    if len(small) < 2:
        return None
    bar = small[0]["establishable"]
    names = ", ".join(f"{c['flag']} (+{plausible_gain(c):.1%})" for c in small)
    where = f" at c={level}" if level is not None and len(levels) > 1 else ""
    why = (
        f"tried together: {names} each expected below +{bar:.1%}{where}, the smallest gain one trial can "
        f"establish with this deployment's restart spread; alone each would stay 'not established'"
    )
    return small, why


def doubtful_members(
    members: list[dict[str, Any]], verdicts: dict[str, Any], won_at: list[int]
) -> list[tuple[dict[str, Any], str]]:
    """The members of a kept bundle that must prove themselves: (candidate, why doubtful): research
    is unsure of it, its mechanism acts at none of the levels that won, or its plausible gain is
    below the minimum effect (the rule keeps no lever that adds less)."""
    out = []
    for c in members:
        sure = certainty(verdicts.get(c["flag"]))
        acts = c.get("acts_at_levels")
        floor = c.get("min_effect") or GAIN_BY_PRIORITY["low"]
        if sure < DOUBTFUL_CERTAINTY:
            out.append((c, f"research certainty {sure:.2f} < {DOUBTFUL_CERTAINTY}"))
        elif plausible_gain(c) < floor:
            out.append((c, f"expected +{plausible_gain(c):.1%} here, below the +{floor:.0%} minimum effect"))
        elif acts is not None and won_at and not set(acts) & set(won_at):
            where = ", ".join(f"c={x}" for x in won_at)
            out.append((c, f"its mechanism acts at {acts or 'no measured level'}, the bundle won at {where}"))
    return out


def _bundle(
    members: list[dict[str, Any]], verdicts: dict[str, Any], reason: str
) -> tuple[float, dict[str, Any]]:
    """(value for one restart, the candidate dict of a bundle): the members' values summed, over the
    slowest member's restart cost. `reason`: why they go together, in a few words."""
    cost = max(restart_cost(c) for c in members)
    value = sum(expected_value(c, verdicts.get(c["flag"])) * restart_cost(c) for c in members) / cost
    return value, {"flag": " + ".join(c["flag"] for c in members), "bundle": members, "together": reason}


def _sure_enough(candidate: dict[str, Any], verdicts: dict[str, Any]) -> bool:
    """A member a kept bundle would keep without leaving it out: research fairly sure it acts, a
    plausible gain above the minimum effect, a mechanism that acts at some measured level, no
    playbook doubt (see `doubtful_members`). A lever expected at no more than the minimum effect
    is not one to keep untested beside bigger ones: on the L40S bench run `--chunked-prefill-size
    8192` (low priority: 2%) rode in a kept bundle and cost 3% at c=64 beside the others."""
    floor = candidate.get("min_effect") or GAIN_BY_PRIORITY["low"]
    return (
        certainty(verdicts.get(candidate["flag"])) >= DOUBTFUL_CERTAINTY
        and plausible_gain(candidate) > floor * 1.001
        and candidate.get("acts_at_levels") != []
        and candidate.get("status") not in PLAYBOOK_DOUBTS
    )


def fit_budget(
    ranked: list[tuple[float, int, dict[str, Any], str]], slots: float | None, verdicts: dict[str, Any]
) -> list[tuple[float, int, dict[str, Any], str]]:
    """The ranking cut to the trials the budget still fits: when the open trials take more than
    `slots` ordinary trials' time (each its `restart_cost`: a slow start counts what its launches
    add), the untried candidates from the last slot on that research is sure enough of
    (`_sure_enough`) and that cost at no measured level go into one change in that slot. Tried one
    at a time they would not be reached at all; together each gets a chance, and a kept bundle
    still loses its doubtful members (`doubtful_members`). The last slot is as long as its slowest
    member's trial: on the simulated 4 x H100 a trial of mixed chunk and then one of torch.compile
    (1.3 trials) did not fit the 2.2 trials left, and torch.compile was refused for time. Unchanged
    when everything fits, or fewer than two would go together."""
    if slots is None or slots < 1 or sum(_cost(e) for e in ranked) <= slots:
        return ranked

    def joins(m: dict[str, Any]) -> bool:  # a lever with a known cost at a measured level goes alone
        return _sure_enough(m, verdicts) and not m.get("costs_at_levels")

    def last_slot(tail: list[tuple[float, int, dict[str, Any], str]]) -> float:
        return max([1.0] + [restart_cost(m) for e in tail for m in e[2].get("bundle") or [e[2]] if joins(m)])

    split = 0
    while (
        split < len(ranked)
        and sum(_cost(e) for e in ranked[: split + 1]) + last_slot(ranked[split + 1 :]) <= slots
    ):
        split += 1
    head, tail = ranked[:split], ranked[split:]
    members: list[dict[str, Any]] = []
    rest = []
    for entry in tail:
        value, i, c, why = entry
        if c.get("second_look") or (why != "untried" and "bundle" not in c):  # a near miss, a retry
            rest.append(entry)
            continue
        group = c.get("bundle") or [c]
        members += [m for m in group if joins(m)]
        others = [m for m in group if not joins(m)]
        if len(others) > 1:  # what is left of a bundle of small levers stays one
            left, still_small = _bundle(others, verdicts, c["together"])
            rest.append((left, i, still_small, why))
        elif others:
            rest.append((expected_value(others[0], verdicts.get(others[0]["flag"])), i, others[0], "untried"))
    if len(members) < 2:
        return ranked
    value, bundle = _bundle(members, verdicts, "more levers than the budget has trials for, tried together")
    names = ", ".join(m["flag"] for m in members)
    why = (
        f"the budget left fits about {slots:g} more trial{'s' * (slots > 1)} and {len(ranked)} are "
        f"open: {names}, each applying here by research, would otherwise not be tried at all"
    )
    return [*head, (value, -2, bundle, why), *rest]


def _cost(entry: tuple[float, int, dict[str, Any], str]) -> float:
    """Ordinary trials' time the trial of a ranked entry takes (a bundle: its slowest member's)."""
    return max(restart_cost(m) for m in entry[2].get("bundle") or [entry[2]])


def sized_steps(
    candidates: list[dict[str, Any]], verdicts: dict[str, Any], tried: dict[str, list[dict[str, Any]]]
) -> list[tuple[float, int, dict[str, Any], str]]:
    """(value per restart, index, candidate at its next value, why) for each sized lever tried
    alone whose search is not over (`next_size`). Valued as any candidate is: research's
    certainty times the most the next value may gain, over a trial's restart cost."""
    out = []
    for i, c in enumerate(candidates):
        results = tried.get(c["flag"], [])
        if not c.get("ladder") or not results or results[-1].get("disturbed"):
            continue
        steps = Ladder.model_validate(c["ladder"])
        nxt = next_size(steps, results, c.get("min_effect") or 0.02, c.get("regress_tolerance") or 0.03)
        if nxt is None:
            continue
        value, gain, why = nxt
        worth = certainty(verdicts.get(c["flag"])) * gain / restart_cost(c)
        out.append((worth, i, {**c, "value": steps.show(value), "sized": True}, why))
    return out


def next_trials(
    candidates: list[dict[str, Any]],
    verdicts: dict[str, Any],
    tried: dict[str, list[dict[str, Any]]],
    slots: float | None = None,
) -> list[tuple[dict[str, Any], str]]:
    """What to trial next, best first: (candidate, why) for the untried candidates and for each near
    miss tried once, ranked by value per restart. `tried`: flag -> its trial results so far. Small
    candidates come as one bundle (`plan_bundle`): a candidate dict with `bundle` (the members).
    `slots`: the trials the budget still fits (None: no limit), see `fit_budget`."""
    ranked: list[tuple[float, int, dict[str, Any], str]] = []
    bundle = plan_bundle(candidates, verdicts, tried)
    if bundle is not None:
        members, why = bundle
        value, entry = _bundle(members, verdicts, "small levers tried together")
        ranked.append((value, -1, entry, why))
    in_bundle = {c["flag"] for c in bundle[0]} if bundle else set()
    ranked += second_looks(candidates, tried) + another_looks(candidates, verdicts, tried)
    ranked += sized_steps(candidates, verdicts, tried)
    for i, c in enumerate(candidates):
        if c["flag"] in in_bundle:
            continue
        results = tried.get(c["flag"], [])
        if not results:
            ranked.append((expected_value(c, verdicts.get(c["flag"])), i, c, "untried"))
        elif len(results) == 1 and results[0].get("disturbed"):
            value = RETRY_SHARE * expected_value(c, verdicts.get(c["flag"]))
            ranked.append((value, i, c, "retry: known-good moved beyond its spread during its trial"))
        elif (sunk := _sunk_by_its_bundle(results)) and _sure_enough(c, verdicts):
            value = RETRY_SHARE * expected_value(c, verdicts.get(c["flag"]))
            ranked.append(
                (value, i, c, f"alone: a bundle it was in {sunk}, which another member may explain")
            )
    ranked.sort(key=lambda x: (-x[0], x[1]))
    return [(c, why) for _, _, c, why in fit_budget(ranked, slots, verdicts)]
