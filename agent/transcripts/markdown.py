"""The review of a saved session (agent/transcripts/review.py) rendered as one Markdown document: context,
baseline, the todo list as it evolved, research verdicts with their evidence, trials, rollbacks,
approvals, what was kept and the final gain."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent.transcripts.bundles import Together, group_todo
from agent.transcripts.review import (
    METRICS,
    MISSING,
    Review,
    TrialRecord,
    describe_change,
    first_key,
    fmt_change,
    fmt_num,
)  # fmt: skip
from agent.transcripts.verdicts import CONDITIONS_MARKER, TODO_MARKER, condition_summary, evidence_lines


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    cells = [[c.replace("|", "\\|").replace("\n", " ") for c in r] for r in rows]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(r) + " |" for r in cells
    ]


def context_lines(ctx: dict[str, Any]) -> list[str]:
    """The context found at the start (version, GPUs, model facts, flags) as Markdown bullets."""
    lines = []
    version = first_key(ctx, "version", "sglang_version")
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
    model = first_key(ctx, "model", "model_facts")
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
    flags = first_key(ctx, "flags", "unit_flags", "current_flags")
    if isinstance(flags, dict):
        lines.append("- Flags at start: " + " ".join(f"{k} {v}" if v else k for k, v in flags.items()))
    return lines


_LABELS = {
    "kind": "Kind",
    "reason": "Tried because",
    "override": "Override of research",
    "probe": "Correctness probe",
}
_LABELS |= {"restarts": "Restarts", "seconds": "Seconds", "notes": "Noticed"}
_LABELS["workload"] = "Measured on (both sides; not the baseline's workload)"
_STATUS_MARK = {"completed": "[x]", "in_progress": "[~]", "cancelled": "[-]", "pending": "[ ]"}


def todo_lines(items: list[dict[str, Any]], together: Sequence[Together] = ()) -> list[str]:
    """A todo list as Markdown checklist lines; the members of a trial of several flags as one
    change (`together`) as one entry, its one effect, with a line per member."""
    out = []
    for entry in group_todo(items, together):
        if isinstance(entry, tuple):
            t, prio = entry
            mark = "[-]" if t.decision == "skipped" else "[x]"
            out.append(f"- {mark} {t.title()}{f' ({prio})' if prio else ''}")
            out += [f"  - {line}" for line in t.member_lines()]
            continue
        mark = _STATUS_MARK.get(str(entry.get("status")), "[ ]")
        prio = f" ({entry['priority']})" if entry.get("priority") else ""
        out.append(f"- {mark} {entry.get('content', entry.get('title', '?'))}{prio}")
    return out or ["- (empty)"]


def todo_evolution(
    states: list[tuple[int | None, list[dict[str, Any]]]], together: Sequence[Together] = ()
) -> list[str]:
    """The first todo list in full, then only what each update changed, then the final list (a
    trial of several flags as one entry, `todo_lines`)."""
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
        out += ["- final list:", *["  " + line for line in todo_lines(states[-1][1], together)]]
    return out


def trial_table(trial: TrialRecord) -> list[str]:
    """Per level, the numbers a trial's decision compared, as a Markdown table: the known-good and
    candidate blocks in the decision's own metric (output tok/s, or p99 TTFT in ms for a goal that
    names it) and its change with the 95% interval; only the change when the decision weighed
    several metrics (a latency goal's TTFT and TPOT). An older transcript without the decision's
    numbers: the candidate against the run's baseline, labelled so."""
    effect = trial.effect
    if effect is not None and effect.metric != "output_throughput":
        return _metric_table(effect)
    levels = sorted(set(trial.baseline) | set(trial.candidate))
    rows = [
        [str(c), fmt_num(trial.baseline.get(c)), fmt_num(trial.candidate.get(c)), trial.change_at(c)]
        for c in levels
    ]
    if not rows:
        return []
    if effect is not None:
        head = ["concurrency", "known-good tok/s", "candidate tok/s", "change [95% CI]"]
        return [*_table(head, rows), "", "(the paired blocks the decision used)"]
    return _table(["concurrency", "run baseline tok/s", "candidate tok/s", "change"], rows)


def _metric_table(effect: Any) -> list[str]:
    """`trial_table` for a decision on another metric than output tok/s: its own numbers beside
    its change (never tok/s beside a change in TTFT)."""
    judged = [lv for lv in effect.levels if lv.ratio is not None]
    if not judged:
        return []
    change = "gain [95% CI], + = lower" if effect.lower_is_better else "change [95% CI]"
    if effect.metric == "objective":
        rows = [[str(lv.concurrency), lv.pct()] for lv in judged]
        return [*_table(["concurrency", f"objective's {change}"], rows), "",
                "(the paired blocks the decision used; several metrics, no one unit)"]  # fmt: skip
    unit = metric_label(effect.metric)
    rows = [[str(lv.concurrency), fmt_num(lv.known_good), fmt_num(lv.candidate), lv.pct()] for lv in judged]
    head = ["concurrency", f"known-good {unit}", f"candidate {unit}", change]
    return [*_table(head, rows), "", "(the paired blocks the decision used)"]


def metric_label(metric: str) -> str:
    """`p99_ttft_ms` -> `p99 TTFT ms`, `request_throughput` -> `req/s`, other throughputs tok/s,
    `goodput` -> `goodput req/s`."""
    if metric == "request_throughput":
        return "req/s"
    if metric == "goodput":
        return "goodput req/s"
    if metric.endswith("_throughput"):
        return f"{metric.removesuffix('_throughput')} tok/s"
    stat, _, rest = metric.partition("_")
    name = rest.removesuffix("_ms")
    words = [w.upper() if w in ("ttft", "tpot", "itl", "e2e") else w for w in name.split("_")]
    return f"{stat} {' '.join(words)} ms"


def kept_caption(t: Any) -> str:
    """The line above a kept trial's table: its decision, and what the numbers are."""
    where = t.extra.get("workload")
    on = f"; both measured on {where}, not the baseline's workload" if where else ""
    if t.extra.get("kind") in ("bundle", "combined") and ", " in t.change:
        n = t.change.count(", ") + 1
        return (
            f"Trial {t.number}, {n} flags tried together ({t.change.replace(', ', ' + ')}): {t.headline} "
            f"(one effect for all {n}, over the configuration deployed before it{on}; no member's "
            "own effect was measured by it)"
        )
    return (
        f"Trial {t.number}, {t.change}: {t.headline} (its own effect, over the configuration "
        f"deployed before it{on})"
    )


def kept_list(review: Review) -> list[str]:
    """The kept changes as Markdown bullets; the members of a kept trial of several flags as one
    entry (they were kept together, on one measured effect)."""
    kept, out = list(review.kept), []
    for g in review.together:
        members = [m.change for m in g.members]
        if g.decision == "kept" and members and all(m in kept for m in members):
            kept = [k for k in kept if k not in members]
            out.append(f"- {g.changes} (tried together in trial {g.number}: one effect for all of them, "
                       "no member's own effect measured by it)")  # fmt: skip
    return out + [f"- {k}" for k in kept]


def final_gain_lines(review: Review) -> list[str]:
    """What each kept change did (its own effect over what was deployed before it, as decided),
    then the user's own workload before and after (the baseline vs the final configuration, with
    intervals); without that measurement, when several were kept, the cumulative before/after of
    the run, labelled as such."""
    out = []
    for t in review.kept_trials:
        out += [kept_caption(t), "", *trial_table(t), ""]
    ba = review.before_after
    if ba is not None and ba.kept:
        return out + ["On your workload:", "", *ba.markdown()]
    if review.kept_trials and len(review.kept_trials) < 2 and all(t.effect for t in review.kept_trials):
        return out[:-1]
    if not review.gain:
        return out + [MISSING] if not out else out[:-1]
    what = (
        "Cumulative, all kept changes together"
        if len(review.kept_trials) > 1
        else "Before/after over the whole run"
    )
    out += [f"{what}: the baseline measured at the start vs the final configuration, measured at "
            "different times under whatever load each saw (not a paired comparison; no decision used it):",
            ""]  # fmt: skip
    rows = [[str(c), fmt_num(b), fmt_num(a), fmt_change(b, a)] for c, (b, a) in review.gain.items()]
    return out + _table(["concurrency", "first baseline tok/s", "final tok/s", "change"], rows)


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
        what = describe_change(first_key(a, "change", "flag", "action"))
        if "approved" not in a:
            out.append(f"- {what}: {a.get('answer') or 'no answer recorded'}")
        else:
            answer = "approved" if a.get("approved") else "declined"
            out.append(f"- {what}: {answer} by {a.get('by', 'user')}")
    return out


def review_markdown(review: Review, *, conditions_marker: bool = False) -> str:
    """The review as a Markdown document (`conditions_marker`: leave paragraphs for the HTML export to
    replace with every condition and the todo list's history, collapsed). One piece because it writes
    one document section by section, in the order it is read; each section's lines are helpers."""
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
    if review.measured:
        out += ["", "## Measured on this deployment", "", *[f"- {m}" for m in review.measured]]
    out += ["", "## Todo list as it evolved", ""]
    if conditions_marker and review.todo_states:  # HTML: the final list, its history collapsed
        out += ["Final list:", "", *todo_lines(review.todo_states[-1][1], review.together), "", TODO_MARKER]
    else:
        out += todo_evolution(review.todo_states, review.together)
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
        group = next((g for g in review.together if g.number == t.number), None)
        change = f"together: {group.changes}" if group else t.change
        out += [f"### Trial {t.number}: {change} — **{t.decision}**{where}", ""]
        out += [f"- Result: {t.headline}"] if t.effect is not None else []
        if group is not None:
            out += [f"- Tried together: {len(group.members)} flags as one change, one measured effect "
                    "for all of them; what is known of each:"]  # fmt: skip
            out += [f"  - {line}" for line in group.member_lines()]
        out += [f"- Benchmark verdict: {t.verdict}", f"- Decision: {t.reason or MISSING}"]
        out += [f"- {_LABELS.get(k, k)}: {v}" for k, v in t.extra.items() if not isinstance(v, dict | list)]
        out += ["", *trial_table(t), ""]
    if not review.trials:
        out += ["no trials", ""]
    out += ["## Rollbacks", "", *([f"- {line}" for line in review.rollbacks] or ["none"])]
    if review.approvals:
        out += ["", "## Approvals", "", *approval_lines(review.approvals)]
    out += ["", "## Kept", "", *(kept_list(review) or ["nothing"])]
    out += ["", "## Final gain per concurrency level", "", *final_gain_lines(review)]
    if review.conclusion:
        out += ["", "## Conclusion", "", review.conclusion]
    return "\n".join(out) + "\n"
