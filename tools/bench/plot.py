"""Plots of sweeps: output throughput, TTFT and TPOT against concurrency, labelled results overlaid."""

from __future__ import annotations

import io
from pathlib import Path

from tools.bench.results import SweepResult
from tools.localfiles import write_bytes

PANELS = (
    ("output_throughput", "output throughput (tok/s)"),
    ("median_ttft_ms", "median TTFT (ms)"),
    ("median_tpot_ms", "median TPOT (ms)"),
)


def _series(
    sweeps: list[SweepResult], metric: str
) -> tuple[list[int], list[float], list[float], list[float]]:
    """Levels with the mean, min and max of `metric` over the repetitions that measured it."""
    xs, mean, lo, hi = [], [], [], []
    for c in sorted({lv.max_concurrency for s in sweeps for lv in s.levels}):
        values = [
            v for s in sweeps if (lv := s.level(c)) is not None and (v := getattr(lv, metric)) is not None
        ]
        if values:
            xs.append(c)
            mean.append(sum(values) / len(values))
            lo.append(min(values))
            hi.append(max(values))
    return xs, mean, lo, hi


def plot_sweeps(results: dict[str, list[SweepResult]], path: Path) -> Path:
    """Write a PNG with one panel per metric and one line per label (before/after overlaid);
    the band around a line spans the repetitions. Missing values are left out, never drawn as 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    levels = sorted({lv.max_concurrency for sweeps in results.values() for s in sweeps for lv in s.levels})
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4), constrained_layout=True)
    for ax, (metric, title) in zip(axes, PANELS, strict=True):
        for label, sweeps in results.items():
            xs, mean, lo, hi = _series(sweeps, metric)
            if not xs:
                continue
            ax.plot(xs, mean, marker="o", label=label)
            if len(sweeps) > 1:
                ax.fill_between(xs, lo, hi, alpha=0.2)
        ax.set_xscale("log", base=2)
        if levels:
            ax.set_xticks(levels)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    buf = io.BytesIO()  # rendered here, written by rename: never through a link planted at `path`
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return write_bytes(path, buf.getvalue())
