"""The run report: Markdown next to the transcript, with a before/after PNG (throughput and latency)."""

from __future__ import annotations

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


def render_report(result: Any, *, plot_name: str | None) -> str:
    """Markdown of a finished run (numbers only from measurements; missing ones say so)."""
    lines = [
        "# optagent run report",
        "",
        f"- status: {result.status}",
        f"- transcript: {result.transcript}",
        f"- deployed: {', '.join(result.kept) or 'baseline configuration (nothing kept)'}",
        f"- trials: {len(result.trials)}, restarts: {result.restarts}, wall time: {result.seconds:.0f} s",
        "",
        "## Output throughput, baseline vs final",
        "",
        *_table(result.baseline, result.final),
        "",
    ]
    if plot_name:
        lines += [f"![before/after]({plot_name})", ""]
    lines += ["## Trials", ""]
    for t in result.trials:
        lines.append(f"- {t.headline()}  (restarts: {t.restarts}, {t.seconds:.0f} s)")
        if t.override:
            lines.append(f"  - deployed against research, reason: {t.override}")
    if not result.trials:
        lines.append("- none")
    lines += ["", result.conclusion, ""]
    return "\n".join(lines)


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
        from tools.bench.plot import plot_sweeps

        series = {"baseline": baseline_reps}
        if best_reps:
            series["final"] = best_reps
        plot_sweeps(series, plot)
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
