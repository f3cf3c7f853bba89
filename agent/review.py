"""A structured account of a saved session, built from its recorded events without any LLM.

Events are written by the run/chat code from its own pydantic models; this module reads them
defensively (several key spellings, anything missing is shown as missing, never invented).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from agent.review_verdicts import CONDITIONS_MARKER, TODO_MARKER, condition_summary, evidence_lines
from agent.transcript import LoadedTranscript

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


def _first(data: dict[str, Any], *keys: str) -> Any:
    return next((data[k] for k in keys if data.get(k) not in (None, "", [], {})), None)


def decision_of(data: dict[str, Any]) -> str:
    raw = _first(data, "decision", "outcome", "status", "result")
    if isinstance(raw, dict):
        raw = _first(raw, "decision", "status")
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
    candidate: dict[int, float | None]
    extra: dict[str, Any]


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
    gain: dict[int, tuple[float | None, float | None]]
    final: dict[int, float | None]
    """Output tok/s per level of the configuration left deployed (empty when never measured)."""
    baseline_sweeps: list[dict[str, Any]]
    conclusion: str
    error: str | None


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
    cand_src = _first(data, "candidate", "candidate_sweeps", "sweeps", "bench", "result")
    candidate = levels_of(cand_src) or levels_of({k: v for k, v in data.items() if "baseline" not in k})
    base = levels_of(_first(data, "baseline", "baseline_sweeps"))
    reason = _first(data, "why", "error", "deploy_error") or _first(comparison, "summary") or ""
    verdict = _first(comparison, "verdict") or _first(data, "verdict", "comparison_verdict") or MISSING
    extra = {
        k: data[k] for k in ("kind", "reason", "override", "probe", "restarts", "seconds") if data.get(k)
    }
    if isinstance(comparison.get("ratio"), int | float):
        extra["ratio"] = round(comparison["ratio"], 4)
    return TrialRecord(
        number=int(data.get("number") or number),
        change=describe_change(_first(data, "changes", "change", "flags", "flag", "name")),
        decision=decision_of(data),
        reason=str(reason),
        verdict=str(verdict),
        msg=event.get("msg"),
        baseline=base or dict(baseline),
        candidate=candidate,
        extra=extra,
    )


def _condition(c: Any) -> str:
    if isinstance(c, dict) and "condition" in c:
        return f"{c['condition']} vs {c.get('fact', '?')}: {c.get('outcome', '?')}"
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
        "flag": describe_change(_first(data, "flag", "name")),
        "verdict": str(_first(data, "verdict", "status") or MISSING),
        "evidence": evidence,
        "conditions": [_condition(c) for c in conditions],
        "summary": str(_first(data, "summary") or ""),
        "effect": str(_first(data, "expected_effect", "effect") or ""),
        "risk": str(_first(data, "risk") or ""),
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
    """Extract the review of one loaded transcript."""
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
    ended_unchanged = loaded.end is not None and not kept
    levels = sorted(set(baseline_tp) | set(final))
    gain = {
        c: (baseline_tp.get(c), final.get(c) if final or not ended_unchanged else baseline_tp.get(c))
        for c in levels
    }
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
        verdicts=[verdict_record(e.get("data") or {}) for e in loaded.events_of("verdict")],
        trials=trials,
        approvals=[e.get("data") or {} for e in loaded.events_of("approval")],
        kept=[describe_change(k) for k in kept],
        gain=gain,
        final=final,
        baseline_sweeps=baseline_sweeps,
        conclusion=conclusion,
        error=loaded.error,
    )


def fmt_num(value: float | None, *, digits: int = 1) -> str:
    """A measured number, or `missing`."""
    return MISSING if value is None else f"{value:,.{digits}f}"


def fmt_change(before: float | None, after: float | None) -> str:
    """`+12.3%`, or `missing` when either side was not measured."""
    if before is None or after is None or before == 0:
        return MISSING
    return f"{(after / before - 1) * 100:+.1f}%"


def gain_summary(review: Review) -> str:
    """A one-line throughput change per level for listings: `1: +2.0%  64: +15.1%`."""
    if not review.gain:
        return ""
    return "  ".join(f"{c}: {fmt_change(b, a)}" for c, (b, a) in review.gain.items())


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    cells = [[c.replace("|", "\\|").replace("\n", " ") for c in r] for r in rows]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(r) + " |" for r in cells
    ]


def context_lines(ctx: dict[str, Any]) -> list[str]:
    """The context found at the start (version, GPUs, model facts, flags) as Markdown bullets."""
    lines = []
    version = _first(ctx, "version", "sglang_version")
    lines.append(f"- SGLang version: {version or MISSING}")
    hw = ctx.get("hardware") if isinstance(ctx.get("hardware"), dict) else ctx
    gpus = hw.get("gpus") or []
    if gpus:
        names: dict[str, int] = {}
        for g in gpus:
            label = (
                f"{g.get('name', '?')} ({g.get('memory_mib', '?')} MiB)" if isinstance(g, dict) else str(g)
            )
            names[label] = names.get(label, 0) + 1
        lines.append("- GPUs: " + ", ".join(f"{n} x {label}" for label, n in names.items()))
    else:
        lines.append(f"- GPUs: {MISSING}")
    if hw.get("interconnect"):
        lines.append(f"- Interconnect: {hw['interconnect']}")
    model = _first(ctx, "model", "model_facts")
    if isinstance(model, dict):
        keys = (
            "architecture",
            "is_moe",
            "num_experts",
            "experts_per_tok",
            "num_layers",
            "dtype",
            "quantization",
        )
        facts = ", ".join(f"{k}={model[k]}" for k in keys if model.get(k) is not None)
        lines.append(f"- Model: {facts or MISSING}")
    elif model:
        lines.append(f"- Model: {model}")
    flags = _first(ctx, "flags", "unit_flags", "current_flags")
    if isinstance(flags, dict):
        lines.append("- Flags at start: " + " ".join(f"{k} {v}" if v else k for k, v in flags.items()))
    return lines


_LABELS = {
    "kind": "Kind",
    "reason": "Tried because",
    "override": "Override of research",
    "probe": "Correctness probe",
}
_LABELS |= {"restarts": "Restarts", "seconds": "Seconds", "ratio": "Throughput ratio"}
_STATUS_MARK = {"completed": "[x]", "in_progress": "[~]", "cancelled": "[-]", "pending": "[ ]"}


def todo_lines(items: list[dict[str, Any]]) -> list[str]:
    """A todo list as Markdown checklist lines."""
    out = []
    for item in items:
        mark = _STATUS_MARK.get(str(item.get("status")), "[ ]")
        prio = f" ({item['priority']})" if item.get("priority") else ""
        out.append(f"- {mark} {item.get('content', item.get('title', '?'))}{prio}")
    return out or ["- (empty)"]


def todo_evolution(states: list[tuple[int | None, list[dict[str, Any]]]]) -> list[str]:
    """The first todo list in full, then only what each update changed, then the final list."""
    out: list[str] = []
    previous: dict[str, dict[str, Any]] = {}
    for i, (msg, items) in enumerate(states, start=1):
        where = f"after msg {msg}" if msg is not None else f"update {i}"
        current = {str(it.get("id", it.get("content"))): it for it in items}
        if i == 1:
            out += [f"- {where}:", *["  " + line for line in todo_lines(items)]]
        else:
            changes = [
                f"  - {it.get('content', '?')}: {previous[k].get('status') if k in previous else 'new'} -> {it.get('status')}"
                for k, it in current.items()
                if k not in previous or previous[k].get("status") != it.get("status")
            ]
            changes += [
                f"  - removed: {previous[k].get('content', '?')}" for k in previous if k not in current
            ]
            out += [f"- {where}:", *(changes or ["  - no change"])]
        previous = current
    if len(states) > 1:
        out += ["- final list:", *["  " + line for line in todo_lines(states[-1][1])]]
    return out


def trial_table(trial: TrialRecord) -> list[str]:
    """Per-level output throughput of a trial against its baseline, as a Markdown table."""
    levels = sorted(set(trial.baseline) | set(trial.candidate))
    rows = [
        [str(c), fmt_num(trial.baseline.get(c)), fmt_num(trial.candidate.get(c))]
        + [fmt_change(trial.baseline.get(c), trial.candidate.get(c))]
        for c in levels
    ]
    return _table(["concurrency", "baseline tok/s", "candidate tok/s", "change"], rows) if rows else []


def approval_lines(approvals: list[dict[str, Any]]) -> list[str]:
    """What the user allowed: how the run was started, and each change asked about (if any)."""
    out = []
    for a in approvals:
        if "approved" not in a and any(k in a for k in ("yes", "dry_run", "allow_lossy")):
            how = (
                "dry run (nothing deployed)"
                if a.get("dry_run")
                else (
                    "started with --yes"
                    if a.get("yes")
                    else "simulated target (no confirmation needed)"
                    if a.get("simulated")
                    else "confirmed at the prompt"
                )
            )
            lossy = "allowed" if a.get("allow_lossy") else "not allowed"
            out.append(f"- Run: {how}; lossy changes {lossy}")
            continue
        what = describe_change(_first(a, "change", "flag", "action"))
        if "approved" not in a:
            out.append(f"- {what}: {a.get('answer') or 'no answer recorded'}")
        else:
            answer = "approved" if a.get("approved") else "declined"
            out.append(f"- {what}: {answer} by {a.get('by', 'user')}")
    return out


def review_markdown(review: Review, *, conditions_marker: bool = False) -> str:
    """The review as a Markdown document (`conditions_marker`: leave paragraphs for the HTML export to
    replace with every condition and the todo list's history, collapsed)."""
    h = review.header
    out = [f"# optagent session {h.get('id', '?')}", ""]
    out += [f"- Kind: {h.get('kind', '?')}, started {h.get('started_at', '?')}, status: {review.status}"]
    out += [
        f"- Goal: {h.get('goal') or MISSING}",
        f"- Model: {h.get('model', '?')}",
        f"- Target: {h.get('target', '?')}",
    ]
    if review.error:
        out += ["", f"> Transcript damaged: {review.error}. Everything before that line is shown."]
    out += ["", "## Context found", "", *context_lines(review.context)]
    out += ["", "## Baseline", ""]
    tp = review.baseline["output_throughput"]
    if tp:
        rows = [[str(c)] + [fmt_num(review.baseline[m].get(c)) for m in METRICS] for c in tp]
        out += _table(["concurrency", "output tok/s", "mean TTFT ms", "p99 ITL ms"], rows)
    else:
        out.append(MISSING)
    out += ["", "## Todo list as it evolved", ""]
    if conditions_marker and review.todo_states:  # HTML: the final list, its history collapsed
        out += ["Final list:", "", *todo_lines(review.todo_states[-1][1]), "", TODO_MARKER]
    else:
        out += todo_evolution(review.todo_states)
    if not review.todo_states:
        out.append("no todo list recorded")
    out += ["", "## Research verdicts", ""]
    if review.verdicts:
        rows = [[v["flag"], f"**{v['verdict']}**", v["effect"], v["risk"]] for v in review.verdicts]
        out += _table(["flag", "verdict", "expected effect", "risk"], rows)
        out += ["", "Evidence (the source lines each verdict rests on):", ""]
        for v in review.verdicts:
            out += evidence_lines(v)
        out += ["", "Conditions checked against this deployment:", ""]
        if conditions_marker:  # the HTML export puts each list, collapsed, under its summary
            out.append(CONDITIONS_MARKER)
        else:
            out += [f"- {v['flag']}: {condition_summary(v['conditions'])}" for v in review.verdicts]
    else:
        out.append("no research recorded")
    out += ["", "## Trials", ""]
    for t in review.trials:
        where = f" (msg {t.msg})" if t.msg is not None else ""
        out += [f"### Trial {t.number}: {t.change} — **{t.decision}**{where}", ""]
        out += [f"- Benchmark verdict: {t.verdict}", f"- Decision: {t.reason or MISSING}"]
        out += [f"- {_LABELS.get(k, k)}: {v}" for k, v in t.extra.items() if not isinstance(v, dict | list)]
        out += ["", *trial_table(t), ""]
    if not review.trials:
        out += ["no trials", ""]
    rolled = [t for t in review.trials if t.decision == "rolled back"]
    out += ["## Rollbacks", ""]
    out += [f"- Trial {t.number} ({t.change}): {t.reason or MISSING}" for t in rolled] or ["none"]
    if review.approvals:
        out += ["", "## Approvals", "", *approval_lines(review.approvals)]
    out += ["", "## Kept", "", *([f"- {k}" for k in review.kept] or ["nothing"])]
    out += ["", "## Final gain per concurrency level", ""]
    if review.gain:
        rows = [[str(c), fmt_num(b), fmt_num(a), fmt_change(b, a)] for c, (b, a) in review.gain.items()]
        out += _table(["concurrency", "baseline tok/s", "final tok/s", "change"], rows)
    else:
        out.append(MISSING)
    if review.conclusion:
        out += ["", "## Conclusion", "", review.conclusion]
    return "\n".join(out) + "\n"
