"""Export a saved session as one self-contained document: Markdown, or HTML with embedded plots."""

from __future__ import annotations

import base64
import html
import io
import math
import statistics
from pathlib import Path
from typing import Any

from agent.transcripts.review import Review, TrialRecord, build_review, fmt_change
from agent.transcripts.markdown import review_markdown, todo_evolution
from agent.transcripts.verdicts import CONDITIONS_MARKER, TODO_MARKER, condition_outcome, condition_summary
from agent.transcripts.transcript import LoadedTranscript

KEPT_COLOR = "#1a7f37"
ROLLED_COLOR = "#cf222e"
BETTER_COLOR = "#1a7f37"
WORSE_COLOR = "#cf222e"
SAME_COLOR = "#8c959f"
BASELINE_COLOR = "#0969da"
NOISE = 0.01
"""Changes within ±1% are drawn as "about the same" (grey), not as better or worse."""

_CSS = f"""
* {{ box-sizing: border-box; }}
body {{ font-family: system-ui, sans-serif; max-width: 1180px; margin: 1.5em auto; padding: 0 16px;
        color: #1f2328; overflow-wrap: break-word; }}
th, strong.kept, strong.rolled {{ white-space: nowrap; }}
td:last-child {{ overflow-wrap: anywhere; }}
table {{ border-collapse: collapse; margin: 0.6em 0; max-width: 100%; }}
th, td {{ border: 1px solid #d0d7de; padding: 4px 10px; text-align: left; vertical-align: top; }}
th {{ background: #f6f8fa; }}
strong.kept {{ background: {KEPT_COLOR}; color: white; padding: 1px 6px; border-radius: 4px; }}
strong.rolled {{ background: {ROLLED_COLOR}; color: white; padding: 1px 6px; border-radius: 4px; }}
figure.plot {{ margin: 1em 0; border: 3px solid #8250df; max-width: 100%; }}
figure.plot img {{ display: block; width: 100%; height: auto; }}
pre {{ white-space: pre-wrap; }}
pre, code {{ background: #f6f8fa; }}
details {{ margin: 0.2em 0; }} summary {{ cursor: pointer; }}
details ul {{ margin: 0.2em 0 0.6em; font-size: 0.9em; }}
li.pass {{ color: {BETTER_COLOR}; }} li.fail {{ color: {WORSE_COLOR}; }} li.unknown {{ color: #656d76; }}
"""


def _label(change: str, width: int = 26) -> str:
    text = change.replace("--", "")
    return text if len(text) <= width else text[: width - 1] + "…"


def _ratio(trial: TrialRecord) -> float | None:
    """Geometric mean of candidate / baseline over the levels both measured."""
    pairs = [(trial.baseline.get(c), v) for c, v in trial.candidate.items()]
    logs = [math.log(v / b) for b, v in pairs if b and v]
    return math.exp(statistics.fmean(logs)) if logs else None


def _colour(ratio: float | None) -> str:
    if ratio is None or abs(ratio - 1) <= NOISE:
        return SAME_COLOR
    return BETTER_COLOR if ratio > 1 else WORSE_COLOR


def plot_png(review: Review) -> bytes | None:
    """`plot_figure(review)` as PNG bytes; None when nothing was measured."""
    fig = plot_figure(review)
    if fig is None:
        return None
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def plot_figure(review: Review) -> Any:
    """A matplotlib figure: output throughput per level before (baseline) and after (final), each
    trial named by its flag and coloured by better/worse than the baseline; and each trial's change
    per level as bars (kept ones outlined). None when nothing was measured."""
    base = {c: v for c, v in review.baseline["output_throughput"].items() if v is not None}
    trials = [t for t in review.trials if any(v is not None for v in t.candidate.values())]
    if not base and not trials:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, (ax, bars) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=100)
    for t in trials:
        pts = sorted((c, v) for c, v in t.candidate.items() if v is not None)
        colour = _colour(_ratio(t))
        ax.plot(*zip(*pts, strict=True), "--", color=colour, alpha=0.7, linewidth=1.2, marker=".")
        ax.annotate(f"#{t.number} {_label(t.change, 18)}", pts[-1], xytext=(4, 0), textcoords="offset points",
                    fontsize=7, color=colour, va="center")  # fmt: skip
    if base:
        ax.plot(*zip(*sorted(base.items()), strict=True), "-o", color=BASELINE_COLOR, linewidth=2.5)
    final = sorted((c, v) for c, v in review.final.items() if v is not None) or sorted(base.items())
    if final:
        ax.plot(*zip(*final, strict=True), "-s", color="black", linewidth=1.8, markersize=5)
    ax.set_xscale("log", base=2)
    ticks = sorted(set(base) | {c for t in trials for c in t.candidate})
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.minorticks_off()
    ax.set_xlim(min(ticks) / 1.3, max(ticks) * 2.2)  # room for the trial names
    ax.set(xlabel="concurrency", ylabel="output tok/s", title="Before (baseline) and after (final)")
    ax.grid(True, alpha=0.3)
    ax.legend(
        handles=[
            Line2D([], [], color=BASELINE_COLOR, marker="o", linewidth=2.5, label="before: baseline"),
            Line2D(
                [],
                [],
                color="black",
                marker="s",
                label="after: final" if review.final else "after: = baseline",
            ),
            Line2D([], [], color=BETTER_COLOR, linestyle="--", label="trial better"),
            Line2D([], [], color=WORSE_COLOR, linestyle="--", label="trial worse"),
            Line2D([], [], color=SAME_COLOR, linestyle="--", label="trial within ±1%"),
        ],
        loc="upper left",
        fontsize=8,
    )
    _change_bars(bars, review.trials, ticks)
    bars.legend(handles=[Patch(color=BETTER_COLOR, label="better"), Patch(color=WORSE_COLOR, label="worse"),
                         Patch(facecolor="white", edgecolor="black", linewidth=2, label="kept")],
                fontsize=8, loc="best")  # fmt: skip
    fig.tight_layout()
    return fig


def _change_bars(ax: Any, trials: list[TrialRecord], levels: list[int]) -> None:
    """Grouped bars: one group per trial (named by its flag), one bar per level, green/red by sign."""
    width = 0.8 / max(1, len(levels))
    for i, t in enumerate(trials):
        if not any(t.baseline.get(c) and t.candidate.get(c) is not None for c in levels):
            # e.g. a candidate that never started: marked, so every trial is on the chart
            ax.plot(i, 0, "x", color=WORSE_COLOR, markersize=11, markeredgewidth=2.5)
            ax.annotate("not measured", (i, 0), xytext=(0, 8), textcoords="offset points", ha="center",
                        fontsize=7, color=WORSE_COLOR)  # fmt: skip
            continue
        for j, c in enumerate(levels):
            before, after = t.baseline.get(c), t.candidate.get(c)
            if not before or after is None:
                continue
            change = (after / before - 1) * 100
            colour = _colour(after / before)
            edge = "black" if t.decision == "kept" else colour
            ax.bar(i + (j - (len(levels) - 1) / 2) * width, change, width * 0.92, color=colour,
                   edgecolor=edge, linewidth=2 if t.decision == "kept" else 0.5)  # fmt: skip
    ax.set_xticks(range(len(trials)), [f"#{t.number} {_label(t.change)}" for t in trials], rotation=25,
                  ha="right", fontsize=8)  # fmt: skip
    ax.set_xlim(-0.7, max(len(trials), 3) - 0.3)  # one trial does not fill the whole panel
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_title(f"Change per trial vs baseline (%), bars: concurrency {', '.join(map(str, levels))}")
    ax.grid(True, axis="y", alpha=0.3)


def save_plot(review: Review, path: Path) -> Path | None:
    """Write `plot_png(review)` to `path` (before and after, every trial); None when nothing was measured."""
    png = plot_png(review)
    if png is None:
        return None
    Path(path).write_bytes(png)
    return Path(path)


def _conditions_html(review: Review) -> str:
    """Every verdict's conditions, collapsed: one summary line each, the full list on click."""
    blocks = []
    for v in review.verdicts:
        if not v["conditions"]:
            blocks.append(f"<p>{html.escape(v['flag'])}: none recorded</p>")
            continue
        items = "".join(f'<li class="{condition_outcome(c)}">{html.escape(c)}</li>' for c in v["conditions"])
        summary = html.escape(f"{v['flag']}: {condition_summary(v['conditions'], failures=0)}")
        blocks.append(f"<details><summary>{summary}</summary><ul>{items}</ul></details>")
    return "".join(blocks)


def _trial_table_html(review: Review) -> str:
    top = max((c for t in review.trials for c in t.candidate), default=None)
    rows = []
    for t in review.trials:
        cls = {"kept": "kept", "rolled back": "rolled"}.get(t.decision, "")
        change = fmt_change(t.baseline.get(top), t.candidate.get(top)) if top is not None else "missing"
        rows.append(
            f"<tr><td>{t.number}</td><td><code>{html.escape(t.change)}</code></td>"
            f'<td><strong class="{cls}">{html.escape(t.decision)}</strong></td>'
            f"<td>{html.escape(t.verdict)}</td><td>{change}</td><td>{html.escape(t.reason)}</td></tr>"
        )
    head = f"<tr><th>#</th><th>change</th><th>decision</th><th>benchmark</th><th>change @{top}</th><th>why</th></tr>"
    return f'<table class="trials">{head}{"".join(rows)}</table>' if rows else "<p>no trials</p>"


def export_markdown(loaded: LoadedTranscript) -> str:
    """The review of the session as Markdown (numbers only from the recorded measurements)."""
    return review_markdown(build_review(loaded))


def export_html(loaded: LoadedTranscript) -> str:
    """A self-contained HTML page: summary table of trials, plots as base64 PNG, the full review."""
    from markdown_it import MarkdownIt

    review = build_review(loaded)
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    body = md.render(review_markdown(review, conditions_marker=True))
    body = body.replace(f"<p>{CONDITIONS_MARKER}</p>", _conditions_html(review))
    history = md.render("\n".join(todo_evolution(review.todo_states)))
    updates = f"How the list evolved ({len(review.todo_states)} updates)"
    body = body.replace(f"<p>{TODO_MARKER}</p>", f"<details><summary>{updates}</summary>{history}</details>")
    body = body.replace("<strong>kept</strong>", '<strong class="kept">kept</strong>')
    body = body.replace("<strong>rolled back</strong>", '<strong class="rolled">rolled back</strong>')
    png = plot_png(review)
    figure = (
        f'<figure class="plot"><img alt="throughput per concurrency level" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}"></figure>'
        if png
        else "<p>No benchmark numbers were recorded: nothing to plot.</p>"
    )
    summary = f"<h2>Trials at a glance</h2>{_trial_table_html(review)}{figure}"
    title = html.escape(f"optagent session {review.header.get('id', '?')}")
    first_h2 = body.find("<h2>")
    body = body[:first_h2] + summary + body[first_h2:] if first_h2 >= 0 else body + summary
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{_CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def export(loaded: LoadedTranscript, fmt: str, path: Path | None = None) -> str:
    """Render `loaded` as `md` or `html`; written to `path` when given, returned either way."""
    if fmt not in ("md", "html"):
        raise ValueError(f"unknown format {fmt!r}: use md or html")
    text = export_markdown(loaded) if fmt == "md" else export_html(loaded)
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text
