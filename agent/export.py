"""Export a saved session as one self-contained document: Markdown, or HTML with embedded plots."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from agent.review import Review, build_review, fmt_change, review_markdown
from agent.transcript import LoadedTranscript

KEPT_COLOR = "#1a7f37"
ROLLED_COLOR = "#cf222e"

_CSS = f"""
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #1f2328; }}
table {{ border-collapse: collapse; margin: 0.6em 0; }}
th, td {{ border: 1px solid #d0d7de; padding: 4px 10px; text-align: left; }}
th {{ background: #f6f8fa; }}
strong.kept {{ background: {KEPT_COLOR}; color: white; padding: 1px 6px; border-radius: 4px; }}
strong.rolled {{ background: {ROLLED_COLOR}; color: white; padding: 1px 6px; border-radius: 4px; }}
figure.plot {{ margin: 1em 0; border: 3px solid #8250df; display: inline-block; }}
figure.plot img {{ display: block; width: 1000px; }}
pre, code {{ background: #f6f8fa; }}
"""


def plot_png(review: Review) -> bytes | None:
    """A PNG of output throughput per concurrency level (baseline, each trial, final) and of each
    trial's change; None when nothing was measured."""
    base = {c: v for c, v in review.baseline["output_throughput"].items() if v is not None}
    trials = [t for t in review.trials if any(v is not None for v in t.candidate.values())]
    if not base and not trials:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bars) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    for t in trials:
        pts = sorted((c, v) for c, v in t.candidate.items() if v is not None)
        color = KEPT_COLOR if t.decision == "kept" else ROLLED_COLOR
        ax.plot(*zip(*pts, strict=True), "--", color=color, alpha=0.45, linewidth=1, marker=".")
    if base:
        ax.plot(
            *zip(*sorted(base.items()), strict=True), "-o", color="#0969da", linewidth=2.5, label="baseline"
        )
    final = sorted((c, v) for c, v in review.final.items() if v is not None)
    if final:
        ax.plot(*zip(*final, strict=True), "-s", color=KEPT_COLOR, linewidth=2.5, label="final")
    ax.set_xscale("log", base=2)
    ticks = sorted(set(base) | {c for t in trials for c in t.candidate})
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tok/s")
    ax.set_title("Throughput per concurrency level")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left")
    top = max((c for t in trials for c in t.candidate), default=max(base, default=1))
    labels, values, colors = [], [], []
    for t in trials:
        before, after = t.baseline.get(top), t.candidate.get(top)
        if before and after is not None:
            labels.append(f"#{t.number}")
            values.append((after / before - 1) * 100)
            colors.append(KEPT_COLOR if t.decision == "kept" else ROLLED_COLOR)
    bars.bar(labels, values, color=colors)
    bars.axhline(0, color="black", linewidth=0.8)
    bars.set_title(f"Change per trial at concurrency {top} (%)")
    bars.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


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
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(review_markdown(review))
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
