"""A structured account of a saved session, built from its recorded events without any LLM.

Events are written by the run/chat code from its own pydantic models; this module reads them
defensively (several key spellings, anything missing is shown as missing, never invented).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from agent.transcripts.before_after import BeforeAfter, compare, describe_bench
from agent.transcripts.bundles import Together, latest_verdicts, together
from agent.transcripts.load import LoadedTranscript
from agent.transcripts.verdicts import plain_condition
from tools.bench.effect import Effect, effect_of, headline, where

MISSING = "missing"
METRICS = ("output_throughput", "mean_ttft_ms", "p99_itl_ms")


def find_sweeps(value: Any) -> list[dict[str, Any]]:
    """Every benchmark sweep (a dict with `levels` of `max_concurrency`) inside a JSON value."""
    if isinstance(value, dict):
        levels = value.get("levels")
        if (
            isinstance(levels, list)
            and levels
            and all(isinstance(v, dict) and "max_concurrency" in v for v in levels)
        ):
            return [value]
        return [s for v in value.values() for s in find_sweeps(v)]
    if isinstance(value, list):
        return [s for v in value for s in find_sweeps(v)]
    return []


def level_means(sweeps: list[dict[str, Any]], metric: str = "output_throughput") -> dict[int, float | None]:
    """The mean of `metric` per concurrency level over repeated sweeps (None when never measured)."""
    values: dict[int, list[float]] = {}
    for sweep in sweeps:
        for lv in sweep.get("levels", []):
            bucket = values.setdefault(int(lv["max_concurrency"]), [])
            if isinstance(lv.get(metric), int | float):
                bucket.append(float(lv[metric]))
    return {c: (statistics.fmean(v) if v else None) for c, v in sorted(values.items())}


def describe_change(change: Any) -> str:
    """A trial's change as the flags it sets/unsets: `--cuda-graph-max-bs 128, -disable-radix-cache`."""
    if change is None:
        return MISSING
    if isinstance(change, str):
        return change
    if isinstance(change, list):
        return ", ".join(describe_change(c) for c in change) or MISSING
    if isinstance(change, dict):
        if "flag" in change and not isinstance(change["flag"], dict):
            if change.get("action") == "unset":
                return f"unset {change['flag']}"
            value = change.get("value")
            return f"{change['flag']} {value}" if value not in (None, "") else str(change["flag"])
        parts = []
        for key in ("set", "flags"):
            if isinstance(change.get(key), dict):
                parts += [f"{k} {v}" if v not in (None, "") else str(k) for k, v in change[key].items()]
        for key in ("unset", "remove"):
            parts += [f"unset {f}" for f in change.get(key) or []]
        return ", ".join(parts) or ", ".join(f"{k}={v}" for k, v in change.items())
    return str(change)


def first_key(data: dict[str, Any], *keys: str) -> Any:
    """The value of the first of `keys` that `data` holds filled in (events spell keys several ways)."""
    return next((data[k] for k in keys if data.get(k) not in (None, "", [], {})), None)


def decision_of(data: dict[str, Any]) -> str:
    raw = first_key(data, "decision", "outcome", "status", "result")
    if isinstance(raw, dict):
        raw = first_key(raw, "decision", "status")
    if raw is None and isinstance(data.get("kept"), bool):
        raw = "kept" if data["kept"] else "rolled back"
    text = str(raw or MISSING).lower().replace("_", " ")
    if "keep" in text or "kept" in text:
        return "kept"
    if "roll" in text or "revert" in text or "reject" in text:
        return "rolled back"
    return text


@dataclasses.dataclass
class TrialRecord:
    """One trial as recorded: the change, its numbers per level and the decision."""

    number: int
    change: str
    decision: str
    reason: str
    verdict: str
    msg: int | None
    baseline: dict[int, float | None]
    """Known-good output tok/s per level: the decision's paired blocks when recorded, else the
    run's baseline (an older transcript)."""
    candidate: dict[int, float | None]
    extra: dict[str, Any]
    effect: Effect | None = None
    """What the decision judged, with intervals (None: nothing measured, or an older transcript)."""
    headline: str = ""
    """`kept: c=64 +4.0% [+1.2..+6.9], no level worse than 3%`."""

    def change_at(self, c: int) -> str:
        """The decision's change at level `c` with its interval, else the plain before/after change."""
        lv = self.effect.level(c) if self.effect else None
        if lv is not None and lv.ratio is not None:
            return lv.pct()
        return fmt_change(self.baseline.get(c), self.candidate.get(c))


@dataclasses.dataclass
class Review:
    """Everything `transcripts review` shows, extracted from one transcript."""

    header: dict[str, Any]
    status: str
    context: dict[str, Any]
    baseline: dict[str, dict[int, float | None]]
    todo_states: list[tuple[int | None, list[dict[str, Any]]]]
    verdicts: list[dict[str, Any]]
    trials: list[TrialRecord]
    approvals: list[dict[str, Any]]
    kept: list[str]
    kept_trials: list[TrialRecord]
    """The kept trials up to the configuration left deployed, each with its own effect."""
    gain: dict[int, tuple[float | None, float | None]]
    """First baseline vs final configuration per level: cumulative, not paired."""
    final: dict[int, float | None]
    """Output tok/s per level of the configuration left deployed (empty when never measured)."""
    baseline_sweeps: list[dict[str, Any]]
    conclusion: str
    error: str | None
    measured: list[str] = dataclasses.field(default_factory=list)
    """What the run measured about the deployment itself (its load at baseline, its launch spread)."""
    together: list[Together] = dataclasses.field(default_factory=list)
    """Each trial of several flags as one change, with what is known of each member."""
    before_after: BeforeAfter | None = None
    """The user's own workload before (the baseline) and after (the configuration left deployed)."""
    rollbacks: list[str] = dataclasses.field(default_factory=list)
    """Every rollback the session did, with why (a trial's A/B/A, the launch spread's relaunches)."""
    rollback_count: int = 0
    """How many rollbacks `rollbacks` counts (the terminal's `deploy: rollback` lines)."""


def levels_of(value: Any) -> dict[int, float | None]:
    """Output tok/s per level from sweeps inside `value`, or from a `levels` mapping `{"64": 812.5}`."""
    sweeps = find_sweeps(value)
    if sweeps:
        return level_means(sweeps)
    levels = value.get("levels") if isinstance(value, dict) else None
    if isinstance(levels, dict):
        out: dict[int, float | None] = {}
        for k, v in levels.items():
            if str(k).isdigit():
                out[int(k)] = float(v) if isinstance(v, int | float) else None
        return dict(sorted(out.items()))
    return {}


def trial_record(number: int, event: dict[str, Any], baseline: dict[int, float | None]) -> TrialRecord:
    """One `trial` event normalized (the agent's `TrialRecord` dump, or older/other spellings)."""
    data = event.get("data") or {}
    comparison = data.get("comparison") if isinstance(data.get("comparison"), dict) else {}
    cand_src = first_key(data, "candidate", "candidate_sweeps", "sweeps", "bench", "result")
    candidate = levels_of(cand_src) or levels_of({k: v for k, v in data.items() if "baseline" not in k})
    base = levels_of(first_key(data, "baseline", "baseline_sweeps"))
    reason = first_key(data, "why", "error", "deploy_error") or first_key(comparison, "summary") or ""
    verdict = first_key(comparison, "verdict") or first_key(data, "verdict", "comparison_verdict") or MISSING
    extra = {
        k: data[k] for k in ("kind", "reason", "override", "probe", "restarts", "workload") if data.get(k)
    }
    if isinstance(data.get("seconds"), int | float) and data["seconds"]:
        extra["seconds"] = f"{data['seconds']:.0f}"
    if isinstance(data.get("notes"), list) and data["notes"]:
        extra["notes"] = "; ".join(map(str, data["notes"]))
    effect = effect_of(data)
    own = effect is not None and effect.metric == "output_throughput"
    if own and any(lv.known_good and lv.candidate for lv in effect.levels):
        # the decision's own blocks, not the run's baseline
        base = {lv.concurrency: lv.known_good for lv in effect.levels}
        candidate = {lv.concurrency: lv.candidate for lv in effect.levels}
    return TrialRecord(
        number=int(data.get("number") or number),
        change=describe_change(first_key(data, "changes", "change", "flags", "flag", "name")),
        decision=decision_of(data),
        reason=str(reason),
        verdict=str(verdict),
        msg=event.get("msg"),
        baseline=base or dict(baseline),
        candidate=candidate,
        extra=extra,
        effect=effect,
        headline=headline({**data, "decision": data.get("decision") or decision_of(data)}),
    )


def _condition(c: Any) -> str:
    if isinstance(c, dict) and "condition" in c:
        return plain_condition(str(c["condition"]), str(c.get("fact", "?")), str(c.get("outcome", "?")))
    return c if isinstance(c, str) else describe_change(c)


def verdict_record(data: dict[str, Any]) -> dict[str, Any]:
    """One `verdict` event (a `FlagVerdict` dump) normalized for display."""
    evidence = []
    for ev in data.get("evidence") or []:
        if isinstance(ev, dict):
            where = ev.get("location") or f"{ev.get('path', '?')}:{ev.get('line', '?')}"
            evidence.append(f"{where} {str(ev.get('quote') or ev.get('text') or '').strip()}".strip())
        else:
            evidence.append(str(ev))
    conditions = data.get("conditions") or []
    return {
        "flag": describe_change(first_key(data, "flag", "name")),
        "verdict": str(first_key(data, "verdict", "status") or MISSING),
        "evidence": evidence,
        "conditions": [_condition(c) for c in conditions],
        "summary": str(first_key(data, "summary") or ""),
        "effect": str(first_key(data, "expected_effect", "effect") or ""),
        "risk": str(first_key(data, "risk") or ""),
    }


def deployed_trial(loaded: LoadedTranscript, trials: list[TrialRecord]) -> TrialRecord | None:
    """The trial whose configuration is deployed at the end: the last kept one, unless a chat undo
    (a `deploy` event with `action: undo`) went back to an earlier one or to the baseline."""
    by_number = {t.number: t for t in trials}
    current: TrialRecord | None = None
    numbered = iter(trials)
    for e in loaded.events:
        data = e.get("data") or {}
        if e.get("kind") == "trial":
            t = next(numbered, None)
            if t is not None and t.decision == "kept":
                current = t
        elif e.get("kind") == "deploy" and data.get("action") == "undo" and data.get("ok"):
            now = str(data.get("now", "baseline"))
            current = by_number.get(int(now.split()[-1])) if now.startswith("trial ") else None
    return current


def build_review(loaded: LoadedTranscript) -> Review:
    """Extract the review of one loaded transcript. One piece because it is one fold of the
    transcript's events into the fields of `Review`, which depend on each other (what was kept
    follows the deployed trial, the final gain follows both); a third of it is the constructor call."""
    header = loaded.header or {}
    context: dict[str, Any] = {}
    for e in loaded.events_of("context"):
        context.update(e.get("data") or {})
    # A resumed session measures a new baseline; the first one is what the session started from.
    baseline_sweeps = next((find_sweeps(e.get("data")) for e in loaded.events_of("baseline")), [])
    baseline_tp = level_means(baseline_sweeps)
    todo_states = []
    for e in loaded.events_of("todo"):
        data = e.get("data") or {}
        items = data.get("items", data.get("todos")) if isinstance(data, dict) else data
        todo_states.append((e.get("msg"), [i for i in items or [] if isinstance(i, dict)]))
    trials = [trial_record(i, e, baseline_tp) for i, e in enumerate(loaded.events_of("trial"), start=1)]
    outcome = (loaded.end or {}).get("outcome") or {}
    kept = outcome.get("kept")
    if not isinstance(kept, list):
        kept = []
    final: dict[int, float | None] = {}
    for e in loaded.events_of("final"):
        final = levels_of(e.get("data")) or final
    deployed = deployed_trial(loaded, trials)
    undone = any((e.get("data") or {}).get("action") == "undo" for e in loaded.events_of("deploy"))
    if undone or (not kept and deployed is not None):
        kept = [deployed.change] if deployed is not None else []
    if not final and deployed is not None:
        final = deployed.candidate
    kept_trials = [t for t in trials if t.decision == "kept" and deployed and t.number <= deployed.number]
    ended_unchanged = loaded.end is not None and not kept
    levels = sorted(set(baseline_tp) | set(final))
    gain = {
        c: (baseline_tp.get(c), final.get(c) if final or not ended_unchanged else baseline_tp.get(c))
        for c in levels
    }
    verdicts = [e.get("data") or {} for e in loaded.events_of("verdict")]
    trial_data = [e.get("data") or {} for e in loaded.events_of("trial")]
    rolled = rollback_lines(loaded, trial_data, trials)
    conclusion = ""
    for e in loaded.events_of("report"):
        data = e.get("data") or {}
        conclusion = str(data.get("conclusion") or data.get("text") or data.get("summary") or conclusion)
    if loaded.end is None:
        status = f"damaged at line {loaded.error_line}" if loaded.error else "unfinished"
    else:
        status = str(outcome.get("status") or "finished")
    return Review(
        header=header,
        status=status,
        context=context,
        baseline={m: level_means(baseline_sweeps, m) for m in METRICS},
        todo_states=todo_states,
        verdicts=[verdict_record(v) for v in verdicts],
        trials=trials,
        approvals=[e.get("data") or {} for e in loaded.events_of("approval")],
        kept=[describe_change(k) for k in kept],
        kept_trials=kept_trials,
        gain=gain,
        final=final,
        baseline_sweeps=baseline_sweeps,
        conclusion=conclusion,
        error=loaded.error,
        measured=[
            str((e.get("data") or {}).get("text"))
            for e in loaded.events
            if e.get("kind") in ("load_state", "launch_spread", "time_use")
            and (e.get("data") or {}).get("text")
        ],
        together=together(trial_data, latest_verdicts(verdicts)),
        before_after=before_after(loaded, kept=bool(kept)),
        rollbacks=[line for line, _ in rolled],
        rollback_count=sum(n for _, n in rolled),
    )


def before_after(
    loaded: LoadedTranscript, *, kept: bool, final: dict[str, Any] | None = None
) -> BeforeAfter | None:
    """The user's workload before and after (`agent.transcripts.before_after`), from the first
    baseline's repetitions and a `final` event (a run's; default its last); None for a session
    without a baseline."""
    first = (next(iter(loaded.events_of("baseline")), None) or {}).get("data") or {}
    reps = next((first[k] for k in ("reps", "sweeps") if isinstance(first.get(k), list)), None)
    baseline = find_sweeps(reps if reps is not None else first)  # each repetition once
    if not baseline:
        return None
    final = final if final is not None else next(reversed(loaded.events_of("final")), None)
    data = (final or {}).get("data") or {}
    spread = next(reversed(loaded.events_of("launch_spread")), None)
    bench = ((loaded.header or {}).get("config") or {}).get("bench")
    return compare(
        baseline, find_sweeps(data) if final else None, workload=describe_bench(bench),
        source=str(data.get("source") or "the final configuration's benchmark recorded at the end"),
        kept=kept, spread=(spread or {}).get("data"),
    )  # fmt: skip


AFTER_BLOCKS = ("after", "after_second")
"""Known-good blocks measured after a candidate's launch: a rollback came before each."""


def rollback_lines(
    loaded: LoadedTranscript, trials: list[dict[str, Any]], records: list[TrialRecord]
) -> list[tuple[str, int]]:
    """Every rollback the session did, read from what recorded it: a trial's blocks (a known-good
    block after a candidate follows a rollback: the A/B/A's), its decision (a candidate rolled back
    for good, or by the deploy itself when it did not start), and the launch spread's relaunches of
    known-good (every other one is a rollback). The decision alone missed the rollbacks of a kept
    trial, which the terminal shows as `deploy: rollback`. Each line with the rollbacks it counts."""
    out = []
    spread = (next(reversed(loaded.events_of("launch_spread")), None) or {}).get("data") or {}
    relaunches = int(spread.get("launches") or 1) - 1 if spread.get("source") == "measured" else 0
    if relaunches > 0:
        n = (relaunches + 1) // 2
        out.append((
            f"Launch spread: {n} rollback{'s' * (n > 1)} among {relaunches} relaunches of known-good, "
            "to measure how far a restart moves it (nothing changed)", n,
        ))  # fmt: skip
    for t, rec in zip(trials, records, strict=False):
        blocks = [b for b, reps in (t.get("blocks") or {}).items() if reps and not b.endswith("_set_aside")]
        between = sum(b in AFTER_BLOCKS for b in blocks)
        what = f"Trial {rec.number} ({rec.change})"
        if rec.decision == "kept":
            if between:
                times = "once" if between == 1 else f"{between} times"
                out.append((
                    f"{what}: kept; rolled back {times} to measure known-good after the candidate "
                    f"(A/B/A), the candidate deployed again after {'it' if between == 1 else 'each'}",
                    between,
                ))  # fmt: skip
            continue
        if rec.decision != "rolled back" or (t.get("deployed") is False and not t.get("deploy_error")):
            continue  # nothing was deployed: nothing to roll back
        last_good = bool(blocks) and blocks[-1] in AFTER_BLOCKS  # its rollback is already counted
        n = between + (0 if last_good else 1)
        how = " (rolled back by the deploy itself: it did not start)" if t.get("deploy_error") else ""
        count = f" ({n} rollbacks in all, known-good measured after each launch)" if n > 1 else ""
        out.append((f"{what}: {rec.reason or MISSING}{how}{count}", n))
    return out


def fmt_num(value: float | None, *, digits: int = 1) -> str:
    """A measured number, or `missing`."""
    return MISSING if value is None else f"{value:,.{digits}f}"


def fmt_change(before: float | None, after: float | None) -> str:
    """`+12.3%`, or `missing` when either side was not measured."""
    if before is None or after is None or before == 0:
        return MISSING
    return f"{(after / before - 1) * 100:+.1f}%"


def gain_summary(review: Review) -> str:
    """What the kept changes did, for listings: each kept trial's deciding level with its interval
    (`c=64 +4.0% [+1.2..+6.9]`); for an older transcript without intervals, the run's before/after
    per level (`1: +2.0%  64: +15.1%`)."""
    decided = [(t.effect, t.effect.deciding) for t in review.kept_trials if t.effect and t.effect.deciding]
    if decided:
        return "; ".join(f"{where(lv)} {effect.change(lv)}" for effect, lv in decided)
    if not review.gain or not review.kept:  # nothing kept: no change to summarize
        return ""
    return "  ".join(f"{c}: {fmt_change(b, a)}" for c, (b, a) in review.gain.items())
