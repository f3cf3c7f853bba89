"""Export a saved session as one self-contained document: Markdown, or HTML with embedded plots."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from agent.transcripts.load import LoadedTranscript
from agent.transcripts.markdown import review_markdown, todo_evolution
from agent.transcripts.review import Review, TrialRecord, build_review
from agent.transcripts.verdicts import CONDITIONS_MARKER, TODO_MARKER, condition_outcome, condition_summary
from tools.localfiles import write_bytes, write_text

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
details ul, ul.members {{ margin: 0.2em 0 0.6em; font-size: 0.9em; }}
li.pass {{ color: {BETTER_COLOR}; }} li.fail {{ color: {WORSE_COLOR}; }} li.unknown {{ color: #656d76; }}
"""


def _label(change: str, width: int = 22) -> str:
    """A flag name for a chart axis: whole, wrapped onto lines of about `width` characters."""
    import textwrap

    return "\n".join(textwrap.wrap(change.replace("--", ""), width, break_on_hyphens=True)) or "?"


def _colour(low: float | None, high: float | None, ratio: float | None) -> str:
    """Green: the interval is above 1 (better); red: below 1 (worse); grey: it includes 1."""
    if low is not None and high is not None:
        return BETTER_COLOR if low > 1 else WORSE_COLOR if high < 1 else SAME_COLOR
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
    """A matplotlib figure of what the decisions measured: left, output tok/s per level of each kept
    change's known-good and candidate blocks (the baseline when nothing was kept); right, each
    trial's change per level with its 95% interval, kept ones outlined. None when nothing was
    measured."""
    base = {c: v for c, v in review.baseline["output_throughput"].items() if v is not None}
    trials = [t for t in review.trials if any(v is not None for v in t.candidate.values())]
    if not base and not trials:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bars) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=100, gridspec_kw={"width_ratios": [2, 3]})
    levels = sorted(set(base) | {c for t in trials for c in t.candidate})
    kept = [t for t in review.kept_trials if any(v is not None for v in t.candidate.values())]
    for i, t in enumerate(kept):
        kg = sorted((c, v) for c, v in t.baseline.items() if v is not None)
        cand = sorted((c, v) for c, v in t.candidate.items() if v is not None)
        shade = ["black", "#8250df", "#bf8700"][i % 3]
        if kg:  # one colour per kept trial: its known-good dashed, its candidate solid
            ax.plot(*zip(*kg, strict=True), "--o", color=shade if len(kept) > 1 else BASELINE_COLOR, linewidth=1.5,
                    label=f"#{t.number} known-good" if _paired_tok_s(t) else "baseline (start of run)")  # fmt: skip
        ax.plot(*zip(*cand, strict=True), "-s", color=shade, linewidth=2, label=f"#{t.number} kept candidate")
    if not kept and base:
        ax.plot(*zip(*sorted(base.items()), strict=True), "-o", color=BASELINE_COLOR, linewidth=2,
                label="baseline (nothing kept)")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()
    ax.set(xlabel="concurrency", ylabel="output tok/s")
    paired = kept and all(_paired_tok_s(t) for t in kept)
    ax.set_title(
        "Kept change: paired blocks" if paired else "Kept change" if kept else "Baseline", fontsize=11
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    _change_bars(bars, review.trials, levels)
    fig.tight_layout()
    return fig


def _paired_tok_s(t: TrialRecord) -> bool:
    """Whether a trial's tok/s are its decision's paired blocks (a decision on another metric, a
    latency, keeps the candidate's tok/s beside the run's baseline)."""
    return t.effect is not None and t.effect.metric == "output_throughput"


def _change_bars(ax: Any, trials: list[TrialRecord], levels: list[int]) -> None:
    """One group per trial, one bar per level: the decision's change with its 95% interval."""
    from matplotlib.patches import Patch

    width = 0.8 / max(1, len(levels))
    used: dict[str, Any] = {}
    for i, t in enumerate(trials):
        drawn = False
        for j, c in enumerate(levels):
            lv = t.effect.level(c) if t.effect else None
            before, after = t.baseline.get(c), t.candidate.get(c)
            ratio = lv.ratio if lv else (after / before if before and after is not None else None)
            if ratio is None:
                continue
            low, high = (lv.ci_low, lv.ci_high) if lv else (None, None)
            colour = _colour(low, high, ratio)
            kept = t.decision == "kept"
            x = i + (j - (len(levels) - 1) / 2) * width
            err = None
            if low is not None and high is not None:
                err = [[(ratio - low) * 100], [(high - ratio) * 100]]
            ax.bar(x, (ratio - 1) * 100, width * 0.92, color=colour, yerr=err, capsize=3, ecolor="black",
                   edgecolor="black" if kept else colour, linewidth=2 if kept else 0.5)  # fmt: skip
            ax.annotate(f"c={c}", (x, 0), xytext=(0, 3 if ratio < 1 else -10), textcoords="offset points",
                        ha="center", fontsize=7)  # fmt: skip
            name = {BETTER_COLOR: "better (interval above 0)", WORSE_COLOR: "worse (interval below 0)"}.get(
                colour, "interval includes 0"
            )
            used.setdefault(name, Patch(color=colour, label=name))
            if kept:
                used.setdefault(
                    "kept", Patch(facecolor="white", edgecolor="black", linewidth=2, label="kept")
                )
            drawn = True
        if not drawn:  # e.g. a candidate that never started: marked, so every trial is on the chart
            ax.plot(i, 0, "x", color=WORSE_COLOR, markersize=11, markeredgewidth=2.5)
            ax.annotate("not measured", (i, 0), xytext=(0, 8), textcoords="offset points", ha="center",
                        fontsize=7, color=WORSE_COLOR)  # fmt: skip
    ax.set_xticks(range(len(trials)), [f"#{t.number} {_label(t.change)}" for t in trials], fontsize=8)
    ax.set_xlim(-0.7, max(len(trials), 3) - 0.3)  # one trial does not fill the whole panel
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_ylabel("change vs known-good, % (95% interval)")
    ax.set_title("Each trial's change per level (bars: concurrency)", fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    if used:
        ax.legend(handles=list(used.values()), fontsize=8, loc="best")


def save_plot(review: Review, path: Path) -> Path | None:
    """Write `plot_png(review)` to `path` (before and after, every trial); None when nothing was measured."""
    png = plot_png(review)
    if png is None:
        return None
    write_bytes(path, png)
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
    groups = {g.number: g for g in review.together}
    for t in review.trials:
        cls = {"kept": "kept", "rolled back": "rolled"}.get(t.decision, "")
        change = html.escape(t.headline.split(": ", 1)[1] if t.effect and ": " in t.headline else
                             (t.change_at(top) if top is not None else "missing"))  # fmt: skip
        what = f"<code>{html.escape(t.change)}</code>"
        if (g := groups.get(t.number)) is not None:  # one effect for all: say what is known of each
            members = "".join(f"<li>{html.escape(line)}</li>" for line in g.member_lines())
            what = (f"{len(g.members)} flags tried together, one effect for all:"
                    f'<ul class="members">{members}</ul>')  # fmt: skip
            change += " (one effect for all)"
        rows.append(
            f"<tr><td>{t.number}</td><td>{what}</td>"
            f'<td><strong class="{cls}">{html.escape(t.decision)}</strong></td>'
            f"<td>{html.escape(t.verdict)}</td><td>{change}</td><td>{html.escape(t.reason)}</td></tr>"
        )
    head = "<tr><th>#</th><th>change</th><th>decision</th><th>benchmark</th><th>decided on (95% CI)</th><th>why</th></tr>"
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
    ba = review.before_after
    workload = f"<p><strong>{html.escape(ba.summary().capitalize())}</strong></p>" if ba is not None else ""
    summary = f"<h2>Trials at a glance</h2>{_trial_table_html(review)}{workload}{figure}"
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
        write_text(path, text)
    return text
