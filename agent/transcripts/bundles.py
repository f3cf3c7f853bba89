"""What was tried together: a trial of several flags at once, its one measured effect, and what is
known of each member (its research verdict; whether its own effect was ever measured).

A bundle (small levers tried as one change) or a combined trial (flags kept alone, tried together)
is decided on one A/B/A comparison of the whole change: its members never won alone, and no output
may show the bundle's interval beside each member as if it had. What is known of a member is its
research verdict and, when a trial measured it, that trial: alone (`single`), or the bundle without
it (a `leave_out` trial, `agent.trial.prune`).

Read from trial records as saved (`agent.trial.record.TrialRecord` dumped to JSON) and research
verdicts (`agent.policy.verdict.FlagVerdict` dumps), so the run's terminal, its report and every
view of a saved transcript say the same.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tools.bench.effect import effect_of, headline, where

TOGETHER_KINDS = ("bundle", "combined")
"""Trial kinds that change several flags as one change (a leave-out changes one, on top of a bundle)."""
NOT_MEASURED = "its own effect not measured separately"
_FLAG = re.compile(r"--[A-Za-z0-9][\w-]*")


@dataclass
class Member:
    """One flag of a trial of several: what research said of it and what, if anything, measured it."""

    flag: str
    change: str
    """`--cuda-graph-max-bs-decode 64`."""
    research: str
    """`applies (code, certainty 0.90)`, or `not researched`."""
    own: str = NOT_MEASURED
    """Its own effect: NOT_MEASURED, or the trial that measured it (alone, or the bundle without it)."""
    latest: bool = True
    """No later trial changed this flag again (alone or in another bundle; a leave-out does not
    count): this trial's outcome is the flag's."""

    def line(self) -> str:
        """`--x 64 — research: applies (code, certainty 0.90); its own effect not measured separately`."""
        return f"{self.change} — research: {self.research}; {self.own}"


@dataclass
class Together:
    """A trial of several flags as one change."""

    number: int
    kind: str
    """bundle | combined."""
    decision: str
    """kept | rolled back | skipped."""
    effect: str
    """The one measured effect, as the trial's headline says it: `kept: c=64 +4.7% [+2.1..+7.5], ...`."""
    reason: str = ""
    members: list[Member] = field(default_factory=list)

    @property
    def changes(self) -> str:
        """`--a 64 + --b + --c`."""
        return " + ".join(m.change for m in self.members)

    def title(self) -> str:
        """`trial 2, 3 flags tried together: kept: c=64 +4.7% [...], ... (one effect for all 3)`."""
        n = len(self.members)
        return f"trial {self.number}, {n} flags tried together: {self.effect} (one effect for all {n})"

    def member_lines(self) -> list[str]:
        """One line per member: its research and its own effect (measured or not)."""
        return [m.line() for m in self.members]

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe, for `--json` outputs and the transcript's todo events."""
        return asdict(self)


def describe(change: Mapping[str, Any]) -> str:
    """A recorded `TrialChange` dump as `--flag value`, `--flag` or `unset --flag`."""
    if change.get("action") == "unset":
        return f"unset {change.get('flag')}"
    value = change.get("value")
    return f"{change.get('flag')}" if value in (None, "") else f"{change.get('flag')} {value}"


def research_words(v: Mapping[str, Any] | None) -> str:
    """`applies (code, certainty 0.90)` of a verdict dump; `not researched` without one."""
    if not v or not v.get("verdict"):
        return "not researched"
    how = [str(v["decided_by"])] if v.get("decided_by") else []
    if isinstance(v.get("certainty"), int | float):
        how.append(f"certainty {v['certainty']:.2f}")
    return f"{v['verdict']} ({', '.join(how)})" if how else str(v["verdict"])


def _flags(trial: Mapping[str, Any]) -> list[str]:
    return [str(c.get("flag")) for c in trial.get("changes") or [] if isinstance(c, Mapping)]


def _decision(trial: Mapping[str, Any]) -> str:
    return str(trial.get("decision") or "?").replace("_", " ")


def _left_out(trial: Mapping[str, Any]) -> str:
    """What a leave-out trial measured of its member: the bundle without it, and what became of it."""
    effect = effect_of(dict(trial))
    lv = effect.deciding if effect else None
    n = trial.get("number")
    if lv is None:
        why = str(trial.get("why") or "nothing measured").split(";")[0]
        return f"trial {n} did not measure the bundle without it ({why}); it stays"
    fate = "left out" if trial.get("decision") == "kept" else "it stays"
    return f"trial {n} measured the bundle without it: {where(lv)} {lv.pct()}; {fate}"


def _own(flag: str, number: int, trials: list[Mapping[str, Any]]) -> str:
    """What measured `flag` apart from the trial `number` it was tried together in."""
    said = []
    for t in trials:
        if _flags(t) != [flag] or t.get("number") == number:
            continue
        if t.get("kind") == "leave_out" and int(t.get("number") or 0) > number:
            said.append(_left_out(t))
        elif t.get("kind", "single") == "single":
            said.append(f"alone in trial {t.get('number')}: {headline(dict(t))}")
    return "; ".join(said) or NOT_MEASURED


def _tried_after(flag: str, number: int, trials: list[Mapping[str, Any]]) -> bool:
    return any(
        int(t.get("number") or 0) > number and t.get("kind") != "leave_out" and flag in _flags(t)
        for t in trials
    )


def together(
    trials: Iterable[Mapping[str, Any]], verdicts: Mapping[str, Mapping[str, Any]] | None = None
) -> list[Together]:
    """Every trial of several flags as one change, in trial order, with what is known of each member
    (`verdicts`: flag -> verdict dump; the latest verdict of a flag counts)."""
    trials = [t for t in trials if isinstance(t, Mapping)]
    verdicts = verdicts or {}
    out = []
    for t in trials:
        changes = [c for c in t.get("changes") or [] if isinstance(c, Mapping)]
        if t.get("kind") not in TOGETHER_KINDS or len(changes) < 2:
            continue
        number = int(t.get("number") or 0)
        members = [
            Member(
                flag=str(c.get("flag")),
                change=describe(c),
                research=research_words(verdicts.get(str(c.get("flag")))),
                own=_own(str(c.get("flag")), number, trials),
                latest=not _tried_after(str(c.get("flag")), number, trials),
            )
            for c in changes
        ]
        out.append(
            Together(
                number=number,
                kind=str(t.get("kind")),
                decision=_decision(t),
                effect=headline(dict(t)),
                reason=str(t.get("reason") or ""),
                members=members,
            )  # fmt: skip
        )
    return out


def latest_verdicts(verdicts: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Flag -> its latest verdict dump, from verdict dumps in the order they came."""
    return {str(v.get("flag")): v for v in verdicts if isinstance(v, Mapping) and v.get("flag")}


def item_flag(item: Mapping[str, Any]) -> str | None:
    """The flag a todo item is about: its id when that is a flag, else the first flag its text names."""
    if str(item.get("id", "")).startswith("--"):
        return str(item["id"])
    m = _FLAG.search(str(item.get("content", "")))
    return m.group(0) if m else None


def group_todo(
    items: Sequence[Mapping[str, Any]], together: Sequence[Together]
) -> list[Mapping[str, Any] | tuple[Together, str]]:
    """A todo list as shown: each item, except that the done items of the members of a trial of
    several flags become one entry, `(that trial, the first member item's priority)`, where the
    first of them stood. An item still pending or in progress is not that trial's outcome yet
    (a later trial of the flag may be under way) and stays as written."""
    groups = {m.flag: t for t in together for m in t.members if m.latest}
    shown: set[int] = set()
    out: list[Mapping[str, Any] | tuple[Together, str]] = []
    for item in items:
        t = groups.get(item_flag(item) or "")
        if t is None or item.get("status") in ("pending", "in_progress"):
            out.append(item)
        elif t.number not in shown:
            shown.add(t.number)
            out.append((t, str(item.get("priority") or "")))
    return out


def from_dict(data: Mapping[str, Any]) -> Together:
    """A `Together.as_dict()` read back (a todo event's `together`)."""
    members = [Member(**{k: v for k, v in m.items() if k in Member.__dataclass_fields__})
               for m in data.get("members") or [] if isinstance(m, Mapping)]  # fmt: skip
    fields = {k: v for k, v in data.items() if k in Together.__dataclass_fields__ and k != "members"}
    return Together(**fields, members=members)
