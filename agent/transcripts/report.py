"""The run report: Markdown next to the transcript, with a before/after PNG (throughput and latency)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.transcripts.sized import curve_lines
from tools.localfiles import write_text

if TYPE_CHECKING:
    from agent.policy.planner import PlannerDeps
    from agent.trial.runner import TrialRunner
    from tools.config import BenchConfig


def _table(baseline: dict[int, float], final: dict[int, float]) -> list[str]:
    lines = ["| concurrency | first baseline tok/s | final tok/s | change |", "|---:|---:|---:|---:|"]
    for c in sorted(set(baseline) | set(final)):
        b, f = baseline.get(c), final.get(c)
        change = f"{(f / b - 1) * 100:+.1f}%" if b and f else "missing"
        show = lambda v: f"{v:,.1f}" if v is not None else "missing"  # noqa: E731
        lines.append(f"| {c} | {show(b)} | {show(f)} | {change} |")
    return lines


def _review_trial(t: Any) -> Any:
    """A trial as the review reads it back from the transcript (one rendering for both)."""
    from agent.transcripts.review import trial_record

    return trial_record(t.number, {"data": t.model_dump(mode="json")}, {})


def end_lines(result: Any) -> list[str]:
    """What the terminal says at the end of a run, after `done`: each kept trial's headline (a
    trial of several flags: a line per member under it), then the user's workload before and
    after."""
    groups = {g.number: g for g in _groups(result, getattr(result, "review", None))}
    out = []
    for t in result.trials:
        if t.decision != "kept":
            continue
        out.append(t.headline())
        if (g := groups.get(t.number)) is not None:
            out += [f"  {line}" for line in g.member_lines()]
    ba = getattr(getattr(result, "review", None), "before_after", None)
    return out + ([ba.summary()] if ba is not None else [])


def kept_lines(result: Any, review: Any = None) -> list[str]:
    """Each kept trial's own effect over what was deployed before it (the paired blocks its
    decision used, with intervals; several flags tried together: one effect, and what is known of
    each member); then the user's own workload before and after (`review.before_after`); without
    it, with several kept, the run's cumulative before/after, labelled."""
    from agent.transcripts.markdown import kept_caption, trial_table

    kept = [_review_trial(t) for t in result.trials if t.decision == "kept"]
    groups = {g.number: g for g in _groups(result, review)}
    out = ["## What the kept change did" if len(kept) < 2 else "## What each kept change did", ""]
    for t in kept:
        members = groups[t.number].member_lines() if t.number in groups else []
        out += [kept_caption(t), "", *[f"- {line}" for line in members], *([""] if members else [])]
        out += [*trial_table(t), ""]
    if not kept:
        out += ["Nothing was kept: the baseline configuration stays deployed.", ""]
    ba = getattr(review, "before_after", None)
    if kept and ba is not None:
        return [*out, "## Before and after on your workload", "", *ba.markdown(), ""]
    if len(kept) > 1:
        out += ["Cumulative, all kept changes together: the baseline measured at the start vs the final "
                "configuration measured at the end, at different times under whatever load each saw "
                "(not a paired comparison; no decision used it):", "",
                *_table(result.baseline, result.final), ""]  # fmt: skip
    return out


RULE = (
    "A candidate is deployed on top of the changes kept so far and measured between two blocks of "
    "the known-good configuration (A/B/A: before it, and after the rollback), so drift and machine "
    "load cancel. Known-good is measured again right before each candidate (and, when its launch came "
    "out slower than the one before it, before that launch is left for another candidate launch); two "
    "blocks of one launch that disagree significantly at a level were not both measured at its speed, "
    "and the slower one is set aside. Repetitions are "
    "adaptive: {reps}, stopping early when no gain of the "
    "minimum effect is possible, and one more at a time (up to {cap}) while a gain is possible but "
    "not established and repetition noise is still a real part of the interval (the restart-to-"
    'restart spread does not shrink with repetitions of one launch). For "improve throughput" the '
    "Pareto rule decides: better at some measured level by at least {min_effect:.0%} (95% interval "
    "above 1), worse at none by more than {tolerance:.0%}; among those, the goal's objective ranks. "
    "A named level or a latency goal decides on that objective alone. A winner, or a candidate whose "
    "estimate comes within a quarter of the minimum effect without being established, is deployed "
    "again; it is kept only if its probe passes and both of its launches against both known-good "
    "launches show the gain; one that still comes within a quarter of the minimum effect gets a third "
    "launch of each side, and all three decide. A clear win at the A/B look (the interval's low end "
    "at twice the minimum effect, known-good measuring as it did before) is kept on its one launch. "
    "A candidate those launches leave within a quarter of the minimum effect may be tried once more "
    "later in the run (a second look), ranked with the untried candidates by what it measured."
)


def _trial_line(t: Any) -> list[str]:
    what = ", ".join(c.describe() for c in t.changes)
    what = {"bundle": f"bundle: {what}", "leave_out": f"leave out {what}"}.get(getattr(t, "kind", ""), what)
    on_top = ", ".join(c.describe() for c in getattr(t, "on_top_of", []) or [])
    decision = t.decision.replace("_", " ")
    line = f"- trial {t.number} `{what}`{f' (on top of {on_top})' if on_top else ''}: **{decision}**"
    headline = _review_trial(t).headline
    if t.comparison and headline.startswith(t.decision.replace("_", " ") + ": "):
        line += ", " + headline.split(": ", 1)[1]
    line += f" — restarts {t.restarts}, {t.seconds:.0f} s"
    out = [line, f"  - {t.why}"]
    if getattr(t, "workload", None):
        out.append(f"  - measured on {t.workload} (both sides): it touches caching, scheduling or memory")
    if getattr(t, "blocks", None):
        out.append("  - repetitions: " + ", ".join(f"{k} {v}" for k, v in t.blocks.items()))
    out += [f"  - {note}" for note in getattr(t, "notes", None) or []]
    if getattr(t, "environment", None):
        out.append(f"  - environment failure, not the flag: {t.environment}")
    if t.override:
        out.append(f"  - deployed against research, reason: {t.override}")
    return out


def _groups(result: Any, review: Any = None) -> list[Any]:
    """The trials of several flags as one change (`agent.transcripts.bundles.Together`): the
    review's, which knows each member's research verdict, else from the trials alone."""
    if review is not None:
        return list(review.together)
    from agent.transcripts.bundles import together

    return together([t.model_dump(mode="json") for t in result.trials])


def _together(trials: list[Any], groups: list[Any] = ()) -> list[str]:
    """What was tried together and why, its one effect, what is known of each member, and which
    members were left out after."""
    lines = []
    by_number = {g.number: g for g in groups}
    for t in trials:
        kind = getattr(t, "kind", "single")
        what = ", ".join(c.describe() for c in t.changes)
        if kind == "bundle":
            lines.append(f"- trial {t.number} `{what}`: {t.decision.replace('_', ' ')}; {t.reason}")
            if (g := by_number.get(t.number)) is not None:
                lines.append(f"  - one measured effect for all {len(g.members)}: {g.effect}")
                lines += [f"  - {line}" for line in g.member_lines()]
        elif kind == "leave_out":
            left = "left out" if t.decision == "kept" else "stays"
            lines.append(f"  - trial {t.number}, `{what}` {left}: {t.why}")
    return ["## Tried together", "", *lines, ""] if lines else []


def _without_trials(conclusion: str) -> str:
    """The conclusion without its own trial, ruled-out and untried lists (the report has them
    above, one reason per candidate)."""
    return re.sub(r"\n### (Trials|Not tried|Ruled out[^\n]*)\n.*?(?=\n### |\Z)", "\n", conclusion, flags=re.S)


def render_report(result: Any, *, plot_name: str | None, review: Any = None) -> str:
    """Markdown of a finished run (numbers only from measurements; missing ones say so); `review`:
    the run's transcript read back (`agent.transcripts.review.Review`), for what only it holds (the
    user's workload before and after, each member's research verdict)."""
    budget = getattr(result, "budget", "") or ""
    lines = [
        "# optagent run report",
        "",
        f"- status: {result.status}",
        f"- transcript: {result.transcript}",
        f"- deployed: {', '.join(result.kept) or 'baseline configuration (nothing kept)'}",
        f"- trials: {len(result.trials)}, restarts: {result.restarts}, wall time: {result.seconds:.0f} s",
    ]
    if budget:
        lines.append(f"- budget: {budget}")
    lines += [f"- {m}" for m in getattr(result, "measured", None) or []]
    ba = getattr(review, "before_after", None)
    if ba is not None:
        lines.append(f"- {ba.summary()}")
    lines += ["", *kept_lines(result, review), *_together(result.trials, _groups(result, review))]
    lines += curve_lines([t.model_dump(mode="json") for t in result.trials])
    if plot_name:
        lines += [f"![each trial's change per level, with its 95% interval]({plot_name})", ""]
    lines += ["## How a change was judged", "", getattr(result, "rule", "") or RULE_DEFAULT, ""]
    lines += ["## Trials", ""]
    for t in result.trials:
        lines += _trial_line(t)
    if not result.trials:
        lines.append("- none")
    untried = getattr(result, "untried", None) or {}
    lines += ["", "## Candidates not tried (one reason each)", ""]
    lines += [f"- {flag}: {why}" for flag, why in untried.items()] or ["- none"]
    lines += ["", _without_trials(result.conclusion), ""]
    return "\n".join(lines)


def run_summary(result: Any) -> dict[str, Any]:
    """`optagent run --json`: kept changes with each level's change and 95% interval as the
    decision measured them (a trial of several flags: `together`, its one effect and each member's
    research and own effect), trials, the user's workload before and after (`user_workload`),
    restarts, wall time and budget (JSON-safe, rounded)."""
    from tools.bench.effect import effect_of, headline

    def pct(v: float | None) -> float | None:
        return None if v is None else round((v - 1) * 100, 2)

    review = getattr(result, "review", None)
    groups = {g.number: g for g in _groups(result, review)}
    kept = []
    for t in result.trials:
        if t.decision != "kept":
            continue
        data = t.model_dump(mode="json")
        effect = effect_of(data)
        # a latency decision: its numbers are that metric's, its ratio a gain (+ is lower)
        unit = "tok_s" if effect is None or effect.metric == "output_throughput" else effect.metric
        change = "gain_pct" if effect is not None and effect.lower_is_better else "change_pct"
        levels = {
            str(lv.concurrency): {
                f"known_good_{unit}": None if lv.known_good is None else round(lv.known_good, 1),
                f"candidate_{unit}": None if lv.candidate is None else round(lv.candidate, 1),
                change: pct(lv.ratio),
                "ci_low_pct": pct(lv.ci_low),
                "ci_high_pct": pct(lv.ci_high),
            }  # fmt: skip
            for lv in (effect.levels if effect else [])
        }
        kept.append({"trial": t.number, "changes": [c.describe() for c in t.changes],
                     "on_top_of": [c.describe() for c in t.on_top_of], "headline": headline(data),
                     "rule": effect.rule if effect else None, "metric": effect.metric if effect else None,
                     "levels": levels, "workload": t.workload,
                     **_together_json(groups.get(t.number))})  # fmt: skip
    return {
        "status": result.status,
        "deployed": list(result.kept),
        "kept": kept,
        "trials": [
            {
                "trial": t.number,
                "changes": [c.describe() for c in t.changes],
                "headline": headline(t.model_dump(mode="json")),
                "workload": t.workload,
                "seconds": round(t.seconds),
                **_together_json(groups.get(t.number)),
            }
            for t in result.trials
        ],  # fmt: skip
        "user_workload": ba.as_dict() if (ba := getattr(review, "before_after", None)) is not None else None,
        "restarts": result.restarts,
        "seconds": round(result.seconds),
        "budget": getattr(result, "budget", "") or "",
        "untried": dict(getattr(result, "untried", {}) or {}),
        "transcript": str(result.transcript) if result.transcript else None,
        "report": str(result.report) if result.report else None,
    }


def _together_json(group: Any) -> dict[str, Any]:
    """`together` of a trial of several flags as one change: its members, each with its research
    verdict and what measured its own effect (`own_effect_measured` false: nothing did); empty for
    a trial of one flag."""
    if group is None:
        return {}
    from agent.transcripts.bundles import NOT_MEASURED

    members = [{"change": m.change, "research": m.research, "own_effect": m.own,
                "own_effect_measured": m.own != NOT_MEASURED} for m in group.members]  # fmt: skip
    return {"together": {"one_effect_for_all": group.effect, "members": members}}


RULE_DEFAULT = RULE.format(reps="3 per block", cap=6, min_effect=0.02, tolerance=0.03)


def write_report(
    result: Any, *, baseline_reps: list[Any], best_reps: list[Any] | None, ui: Any = None
) -> Path | None:
    """Write `<transcript>.report.md` and `<transcript>.png`; a plotting failure only drops the image."""
    if result.transcript is None:
        return None
    base = Path(result.transcript).with_suffix("")
    plot = base.with_name(base.name + ".png")
    plot_name: str | None = plot.name
    kept = [t for t in result.trials if t.decision == "kept"]
    if ui is not None and (best_reps or kept):  # the final configuration's numbers, for the review
        reps = [s.model_dump(mode="json") for s in best_reps or []]  # none: its final check failed
        ui.record("final", {"reps": reps, "source": final_source(kept[-1] if kept else None)})
    review = None
    try:
        from agent.transcripts.load import load_transcript
        from agent.transcripts.review import build_review

        review = build_review(load_transcript(result.transcript))
        result.review = review
    except Exception as e:  # the report is still useful without what only the transcript holds
        if ui is not None:
            ui.note(f"[yellow]transcript not read back for the report:[/] {e}")
    try:
        from agent.transcripts.export import save_plot
        from tools.bench.plot import plot_sweeps

        # before and after with every trial, as the review and the HTML export show them
        if review is None or save_plot(review, plot) is None:
            plot_sweeps({"baseline": baseline_reps, **({"final": best_reps} if best_reps else {})}, plot)
    except Exception as e:  # the report is still useful without the picture
        plot_name = None
        if ui is not None:
            ui.note(f"[yellow]plot not written:[/] {e}")
    path = base.with_name(base.name + ".report.md")
    write_text(path, render_report(result, plot_name=plot_name, review=review))
    if ui is not None:
        ui.record("report", {"path": str(path), "plot": str(plot) if plot_name else None})
        ui.note(f"report: {path}", record=False)
    return path


def final_source(best: Any) -> str:
    """Where the final configuration's numbers on the user's workload come from: the final check
    after a winner judged on another workload (`agent.session`), else the last kept trial's last
    candidate block, measured on the user's workload with everything kept so far deployed."""
    from agent.transcripts.before_after import FINAL_CHECK

    if best is None:
        return "the final configuration's benchmark at the end of the run"
    if best.workload:
        return FINAL_CHECK
    return f"trial {best.number}'s last candidate block (on your workload, with every change kept so far)"


def _block_reps(runner: TrialRunner | None, bench: BenchConfig) -> str:
    """How many repetitions a trial's block starts with, and why when not the configured number."""
    start = runner.block_reps if runner is not None else bench.reps
    if start == bench.reps:
        return f"{start} per block"
    return f"{start} per block (the baseline's took {bench.reps}: a restart moves this server far more than a repetition does)"


def time_use(
    seconds: float, phases: list[tuple[str, float]], runner: TrialRunner | None, spread_restarts: int
) -> str:
    """Where the run's wall time went: each phase of `phases` ((name, seconds), in order), the
    trials apart from the research and planning around them, and what was restarting in both the
    launch spread and the trials (a deploy until healthy) against the benchmarks and probes; the
    rest, the final check. What a budget that ran out was spent on, and what more time would buy."""
    launches = list(getattr(runner, "launch_seconds", None) or [])
    trials = sum(t.seconds for t in getattr(runner, "trials", None) or [])

    def restarts(part: list[float]) -> str:
        return f" ({len(part)} restarts {sum(part):.0f} s)" if part else ""

    parts = []
    for name, s in phases:
        if s < 0.5:  # a phase that did not run (a spread known already)
            continue
        if name == "launch spread":
            parts.append(f"{name} {s:.0f} s{restarts(launches[:spread_restarts])}")
        elif runner is not None and name.endswith("trials"):
            parts.append(f"research and planning {max(0.0, s - trials):.0f} s")
            inside = [restarts(launches[spread_restarts:]).strip(" ()"), _planned(runner)]
            detail = "; ".join(x for x in inside if x)
            parts.append(f"trials {trials:.0f} s" + (f" ({detail})" if detail else ""))
        else:
            parts.append(f"{name} {s:.0f} s")
    parts.append(f"final check {max(0.0, seconds - sum(s for _, s in phases)):.0f} s")
    return f"time: {', '.join(parts)}; {seconds:.0f} s in all"


def _planned(runner: TrialRunner) -> str:
    """What the deployed trials were budgeted at their starts, against what they took."""
    ran = [t for t in getattr(runner, "trials", None) or [] if t.deployed and t.planned_seconds > 0]
    if not ran:
        return ""
    planned, took = sum(t.planned_seconds for t in ran), sum(t.seconds for t in ran)
    return f"planned {planned:.0f} s at their starts, {took:.0f} s taken"


def explain_run(result: Any, deps: PlannerDeps, runner: TrialRunner | None, opts: Any, config: Any) -> None:
    """Fill in the budget sentence, the rule, and why each untried candidate was not tried."""
    bench = config.bench
    cap = runner.max_reps if runner else 2 * bench.reps
    result.rule = RULE.format(
        reps=_block_reps(runner, bench),
        cap=cap,
        min_effect=bench.min_effect,
        tolerance=bench.regress_tolerance,
    )
    spent = runner.exhausted if runner is not None and runner.exhausted is not None else None
    if spent is None and deps.unresearched:  # research met the deadline before any trial did
        spent = f"wall-time budget: research stopped, {len(deps.unresearched)} candidates not researched"
    restarts = (
        f"; {runner.restarts} of {runner.max_restarts} restarts (--max-restarts; default one per lever "
        "of the playbook not set already, at least 8)"
        if runner is not None and runner.max_restarts is not None
        else ""
    )
    result.budget = (
        f"{opts.max_wall_minutes:g} min wall-time budget (--max-minutes), {result.seconds / 60:.1f} min used"
        + restarts
        + (f"; spent: {spent}" if spent else "; not spent")
    )
    tried = {ch.flag for t in result.trials for ch in t.changes}
    for c in deps.candidates:
        label = c.change
        if c.flag in tried:
            continue
        v = deps.verdicts.get(c.flag)
        # one reason per candidate, in the conclusion's order: a sure research verdict, then the playbook
        if v is not None and v.rejected:
            result.untried[label] = f"research: {v.verdict} — {v.summary}"
        elif c.status != "candidate":
            result.untried[label] = f"playbook: {getattr(c, 'ruled_out', '') or f'{c.status} ({c.note})'}"
        elif c.flag in deps.unresearched:  # no verdict: the deadline came before its research
            result.untried[label] = deps.unresearched[c.flag]
        elif c.lever.lossy and not opts.allow_lossy:
            result.untried[label] = "lossy (changes outputs); --allow-lossy not given"
        elif runner is not None and runner.halted:
            result.untried[label] = f"trials stopped: {runner.halted}"
        elif runner is not None and runner.exhausted:
            result.untried[label] = f"budget: {runner.exhausted}"
        elif opts.dry_run:
            result.untried[label] = "dry run"
        else:
            result.untried[label] = "not chosen by the planner"
