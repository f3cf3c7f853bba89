"""The run report: Markdown next to the transcript, with a before/after PNG (throughput and latency)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


def _table(baseline: dict[int, float], final: dict[int, float]) -> list[str]:
    lines = ["| concurrency | baseline tok/s | final tok/s | change |", "|---:|---:|---:|---:|"]
    for c in sorted(set(baseline) | set(final)):
        b, f = baseline.get(c), final.get(c)
        change = f"{(f / b - 1) * 100:+.1f}%" if b and f else "missing"
        show = lambda v: f"{v:,.1f}" if v is not None else "missing"  # noqa: E731
        lines.append(f"| {c} | {show(b)} | {show(f)} | {change} |")
    return lines


RULE = (
    "A candidate is deployed on top of the changes kept so far and measured between two blocks of "
    "the known-good configuration (A/B/A: before it, and after the rollback), so drift and machine "
    "load cancel. Known-good is measured again right before each candidate (and before its launch is "
    "left for another candidate launch); two blocks of one launch that disagree significantly at a "
    "level were not both measured at its speed, and the slower one is set aside. Repetitions are "
    "adaptive: {reps} per block, stopping early when no gain of the "
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
    on_top = ", ".join(c.describe() for c in getattr(t, "on_top_of", []) or [])
    decision = t.decision.replace("_", " ")
    line = f"- trial {t.number} `{what}`{f' (on top of {on_top})' if on_top else ''}: **{decision}**"
    cmp = t.comparison or {}
    if isinstance(cmp.get("ratio"), float):
        line += f", objective {(cmp['ratio'] - 1) * 100:+.1f}%"
    line += f" — restarts {t.restarts}, {t.seconds:.0f} s"
    out = [line, f"  - {t.why}"]
    if getattr(t, "blocks", None):
        out.append("  - repetitions: " + ", ".join(f"{k} {v}" for k, v in t.blocks.items()))
    out += [f"  - {note}" for note in getattr(t, "notes", None) or []]
    if getattr(t, "environment", None):
        out.append(f"  - environment failure, not the flag: {t.environment}")
    if t.override:
        out.append(f"  - deployed against research, reason: {t.override}")
    return out


def _without_trials(conclusion: str) -> str:
    """The conclusion without its own trial and untried lists (the report has both, above)."""
    return re.sub(r"\n### (Trials|Not tried)\n.*?(?=\n### |\Z)", "\n", conclusion, flags=re.S)


def render_report(result: Any, *, plot_name: str | None) -> str:
    """Markdown of a finished run (numbers only from measurements; missing ones say so)."""
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
    lines += ["", "## Output throughput, baseline vs final", "", *_table(result.baseline, result.final), ""]
    if plot_name:
        lines += [f"![before/after]({plot_name})", ""]
    lines += ["## How a change was judged", "", getattr(result, "rule", "") or RULE_DEFAULT, ""]
    lines += ["## Trials", ""]
    for t in result.trials:
        lines += _trial_line(t)
    if not result.trials:
        lines.append("- none")
    untried = getattr(result, "untried", None) or {}
    lines += ["", "## Candidates not tried", ""]
    lines += [f"- {flag}: {why}" for flag, why in untried.items()] or ["- none"]
    lines += ["", _without_trials(result.conclusion), ""]
    return "\n".join(lines)


RULE_DEFAULT = RULE.format(reps=3, cap=6, min_effect=0.02, tolerance=0.03)


def write_report(
    result: Any, *, baseline_reps: list[Any], best_reps: list[Any] | None, ui: Any = None
) -> Path | None:
    """Write `<transcript>.report.md` and `<transcript>.png`; a plotting failure only drops the image."""
    if result.transcript is None:
        return None
    base = Path(result.transcript).with_suffix("")
    plot = base.with_name(base.name + ".png")
    plot_name: str | None = plot.name
    try:
        from agent.transcripts.export import save_plot
        from agent.transcripts.review import build_review
        from agent.transcripts.transcript import load_transcript
        from tools.bench.plot import plot_sweeps

        # before and after with every trial, as the review and the HTML export show them
        if save_plot(build_review(load_transcript(result.transcript)), plot) is None:
            plot_sweeps({"baseline": baseline_reps, **({"final": best_reps} if best_reps else {})}, plot)
    except Exception as e:  # the report is still useful without the picture
        plot_name = None
        if ui is not None:
            ui.note(f"[yellow]plot not written:[/] {e}")
    path = base.with_name(base.name + ".report.md")
    path.write_text(render_report(result, plot_name=plot_name))
    if ui is not None:
        ui.record("report", {"path": str(path), "plot": str(plot) if plot_name else None})
        ui.note(f"report: {path}", record=False)
    return path


def explain_run(result: Any, deps: Any, runner: Any, opts: Any, config: Any) -> None:
    """Fill in the budget sentence, the rule, and why each untried candidate was not tried."""
    bench = config.bench
    cap = runner.max_reps if runner else 2 * bench.reps
    result.rule = RULE.format(
        reps=bench.reps, cap=cap, min_effect=bench.min_effect, tolerance=bench.regress_tolerance
    )
    spent = runner is not None and runner.exhausted is not None
    restarts = (
        f"; {runner.restarts} of {runner.max_restarts} restarts (--max-restarts; default one per lever "
        "of the playbook not set already, at least 8)"
        if runner is not None and runner.max_restarts is not None
        else ""
    )
    result.budget = (
        f"{opts.max_wall_minutes:g} min wall-time budget (--max-minutes; the simulated deployment's "
        f"default is 10), {result.seconds / 60:.1f} min used"
        + restarts
        + (f"; spent: {runner.exhausted}" if spent else "; not spent")
    )
    tried = {ch.flag for t in result.trials for ch in t.changes}
    for c in deps.candidates:
        label = c.change
        if c.flag in tried:
            continue
        v = deps.verdicts.get(c.flag)
        if c.status != "candidate":
            result.untried[label] = f"playbook: {c.status} ({c.note})"
        elif v is not None and v.rejected:
            result.untried[label] = f"research: {v.verdict} — {v.summary}"
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
