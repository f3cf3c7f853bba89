"""`optagent bench --goal "maximize goodput with p99 TTFT under 300 ms ..."`: the rate curve.

Requests arrive as a Poisson process (`bench_serving --request-rate`); the search
(`tools.bench.goodput.find_goodput`) finds the highest rate at which every limit of the goal holds.
Each run is printed as a row of the rate curve, the limits and the goodput under it; `--json` saves
the curve, `--plot` draws each limit's statistic against the rate with the limit as a line.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from rich.table import Table

from agent.cli.common import console, err_console, fail
from tools.bench.goodput import GOODPUT_PROMPTS, RateCurve, curve_as_dict, find_goodput
from tools.bench.loadgen import Progress, rate_runs
from tools.bench.objective import Objective
from tools.config import BenchConfig
from tools.localfiles import write_bytes, write_text


def check_goodput(unused: dict[str, object]) -> None:
    """Exit 2 before anything runs when an option of a concurrency sweep is given with a goodput goal."""
    given = [name for name, value in unused.items() if value not in (None, False)]
    if given:
        fail(f"a goodput goal searches request rates; {', '.join(given)} cannot be used with it", code=2)


def run_goodput(endpoint: str, settings: BenchConfig, objective: Objective, json_file: Path | None,
                plot_file: Path | None) -> None:  # fmt: skip
    """Search the goodput of `endpoint` under the goal's limits, print the curve, save what was asked."""
    prompts = settings.prompts_per_level or GOODPUT_PROMPTS
    err_console.print(
        f"[dim]{objective.description}: {prompts} requests per rate, Poisson arrivals[/]", highlight=False
    )

    def on_progress(p: Progress) -> None:  # one line per finished run, not a bar per request
        if p.finished:
            err_console.print(
                f"[dim]  run done: {p.done} requests in {p.elapsed_s:.1f} s[/]", highlight=False
            )

    measure = rate_runs(endpoint, settings, prompts=prompts, on_progress=on_progress)
    curve = asyncio.run(find_goodput(measure, objective.limits))
    print_curve(curve)
    if json_file:
        write_text(json_file, json.dumps(curve_as_dict(curve), indent=2) + "\n")
        console.print(f"saved {json_file}")
    if plot_file and curve.points:
        write_bytes(plot_file, plot_curve(curve))
        console.print(f"saved {plot_file}")
    if curve.goodput is None:
        fail(curve.describe())


def print_curve(curve: RateCurve) -> None:
    """The runs by rate: what each measured of every limit, and whether it held."""
    title = "rate curve (Poisson arrivals), times in ms"
    if curve.ceiling is not None:
        title += f"; all requests at once: {curve.ceiling:.3g} req/s"
    table = Table(title=title)
    for col in ("rate req/s", "ok/fail", "served req/s", *(s.metric for s in curve.limits), "holds"):
        table.add_column(col, justify="right")
    for p in curve.sorted_points():
        served = p.level.request_throughput
        row = [
            f"{p.rate:.3g}",
            f"{p.level.completed}/{p.level.failed}",
            "missing" if served is None else f"{served:.3g}",
        ]
        for s in curve.limits:
            value = getattr(p.level, s.metric)
            row.append("missing" if value is None else f"{value:,.1f}")
        row.append("yes" if p.held else f"no: {p.broken}")
        table.add_row(*row, style=None if p.held else "red")
    console.print(table)
    console.print(curve.describe(), highlight=False)


def plot_curve(curve: RateCurve) -> bytes:
    """PNG bytes: one panel per limit, its statistic against the offered rate, the limit dashed and
    the goodput marked."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = curve.sorted_points()
    fig, axes = plt.subplots(
        1, len(curve.limits), figsize=(5 * len(curve.limits), 4), constrained_layout=True
    )
    for ax, slo in zip(axes if len(curve.limits) > 1 else [axes], curve.limits, strict=True):
        xs = [p.rate for p in points if getattr(p.level, slo.metric) is not None]
        ys = [getattr(p.level, slo.metric) for p in points if getattr(p.level, slo.metric) is not None]
        ax.plot(xs, ys, marker="o")
        ax.axhline(slo.max_ms, linestyle="--", color="red", label=f"limit {slo.max_ms:g} ms")
        if curve.goodput is not None:
            ax.axvline(
                curve.goodput, linestyle=":", color="green", label=f"goodput {curve.goodput:.3g} req/s"
            )
        ax.set_xlabel("offered request rate (req/s)")
        ax.set_title(slo.metric)
        ax.grid(True, alpha=0.3)
        ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
