"""`optagent bench`: concurrency sweeps, comparisons and plots."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Literal

import typer
from pydantic import ValidationError
from rich.table import Table

from agent.cli.common import ConfigOption, console, err_console, fail, get_config
from tools.bench.objective import Objective
from tools.bench.results import SweepResult, load_sweeps, save_sweeps
from tools.config import BenchConfig, Config
from tools.redact import redact_text

app = typer.Typer(
    help=__doc__, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]}
)


def _levels(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:  # "1 8" is two levels (1, 8), never 18
        return [int(x) for x in re.split(r"[\s,]+", text.strip()) if x]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers like 1,8,64, got {text!r}") from None


def _settings(cfg: Config, overrides: dict[str, object]) -> BenchConfig:
    data = {**cfg.bench.model_dump(), **{k: v for k, v in overrides.items() if v is not None}}
    try:
        return BenchConfig.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        fail(f"invalid benchmark settings: {problems}", code=2)


def _sim_endpoint() -> str:
    """Start the simulated deployment in `.optagent/sim` if needed and return its endpoint."""
    try:
        from sim.host import ensure_up
    except ImportError:
        fail("the simulated deployment is not available in this installation; pass --endpoint or --config")
    from tools.config import DEFAULT_SIM_DIR

    err_console.print(
        f"[dim]target: the simulated deployment in {DEFAULT_SIM_DIR} (starting it if needed)[/]"
    )
    try:
        return ensure_up(DEFAULT_SIM_DIR).target.endpoint
    except Exception as e:  # any failure to start is reported, never a traceback
        fail(f"the simulated deployment did not start: {e}")


@app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    config: Path | None = ConfigOption,
    endpoint: str | None = typer.Option(None, "--endpoint", help="Server URL, e.g. http://127.0.0.1:30000."),
    concurrency: str | None = typer.Option(None, "--concurrency", help="Levels, e.g. 1,8,64."),
    input_len: int | None = typer.Option(None, "--input-len", help="Prompt tokens per request."),
    output_len: int | None = typer.Option(None, "--output-len", help="Output tokens per request."),
    prompts_per_level: int | None = typer.Option(None, "--prompts-per-level", help="0 = max(8, 2 x level)."),
    reps: int | None = typer.Option(None, "--reps", help="Repetitions of the sweep."),
    api: Literal["completions", "chat", "generate"] | None = typer.Option(None, "--api"),
    workload: Literal["random", "shared-prefix", "multiturn"] | None = typer.Option(
        None, "--workload", help="What each level sends (a mix: [bench] workload in the config)."
    ),
    backend: Literal["optagent", "sglang"] | None = typer.Option(
        None, "--backend", help="optagent's client, or sglang.bench_serving run on the host."
    ),
    warmup: int | None = typer.Option(None, "--warmup", help="Uncounted warm-up requests per sweep."),
    request_rate: float | None = typer.Option(None, "--request-rate", help="Poisson arrivals (req/s)."),
    prompt_file: Path | None = typer.Option(None, "--prompt-file", help="JSONL prompts (ShareGPT-like)."),
    json_file: Path | None = typer.Option(None, "--json", help="Save the result(s) as JSON."),
    plot_file: Path | None = typer.Option(None, "--plot", help="Save a PNG plot."),
    restarts: int | None = typer.Option(
        None, "--restarts", help="Relaunch known-good N times; record the launch spread in the config."
    ),
    goal: str | None = typer.Option(
        None,
        "--goal",
        help='A goodput goal: "maximize goodput with p99 TTFT under 300 ms and p99 TPOT under 40 ms".',
    ),
) -> None:
    """Sweep concurrency levels against the server and print a table of the results (with a goodput
    --goal: search the highest request rate meeting its limits and print the rate curve).
    \f

    One piece because it is a typer callback read top to bottom: the options checked in the order
    they are read, `--restarts` and `--goal` handed off, then the sweep and its report; a third
    of it is the option list.
    """
    if ctx.invoked_subcommand:
        return
    cfg = get_config(config)
    overrides = dict(
        concurrency=_levels(concurrency), input_len=input_len, output_len=output_len,
        prompts_per_level=prompts_per_level, reps=reps, api=api, warmup=warmup, backend=backend,
        workload=workload,
    )  # fmt: skip
    settings = _settings(cfg, overrides)
    if restarts is not None:
        from agent.cli.bench_spread import check_restarts, record_spread

        unused = {"--endpoint": endpoint, "--request-rate": request_rate, "--prompt-file": prompt_file,
                  "--json": json_file, "--plot": plot_file, "--backend sglang": settings.backend == "sglang"}  # fmt: skip
        check_restarts(restarts, settings, unused)
        return record_spread(config, settings, restarts)
    objective = _goodput_objective(goal)
    if objective is not None:
        from agent.cli.bench_goodput import check_goodput

        check_goodput({"--concurrency": concurrency, "--reps": reps, "--request-rate": request_rate,
                       "--restarts": restarts, "--prompt-file": prompt_file,
                       "--backend sglang": settings.backend == "sglang"})  # fmt: skip
    if request_rate is not None and request_rate <= 0:
        fail("--request-rate must be positive", code=2)
    if prompt_file is not None:
        from tools.bench.prompts import PromptFileError, load_prompt_file

        try:
            load_prompt_file(prompt_file, output_len=settings.output_len)
        except (OSError, PromptFileError) as e:
            fail(f"bad --prompt-file: {e}", code=2)
    if endpoint is None:
        endpoint = _sim_endpoint() if cfg.simulated and config is None else cfg.target.endpoint
    if not endpoint.startswith(("http://", "https://")):
        fail(f"--endpoint must start with http:// or https://, got {endpoint!r}", code=2)
    if objective is not None:
        from agent.cli.bench_goodput import run_goodput

        return run_goodput(endpoint.rstrip("/"), settings, objective, json_file, plot_file)
    sweeps = _run_with_progress(endpoint.rstrip("/"), settings, cfg, request_rate, prompt_file)
    unreachable = any("cannot reach" in e for s in sweeps for e in s.errors)
    if unreachable and not any(lv.completed for s in sweeps for lv in s.levels):
        if json_file:
            save_sweeps(sweeps, json_file)  # the errors, for the record
        hint = "`optagent sim status`" if cfg.simulated and config is None else "`optagent status`"
        fail(redact_text(f"cannot reach {endpoint}: nothing was measured; is the server running? {hint}"))
    _print_sweeps(sweeps)
    if json_file:
        save_sweeps(sweeps, json_file)
        console.print(f"saved {json_file}")
    if plot_file and any(s.levels for s in sweeps):
        from tools.bench.plot import plot_sweeps

        plot_sweeps({"result": sweeps}, plot_file)
        console.print(f"saved {plot_file}")
    if any(s.partial for s in sweeps):
        errors = [e for s in sweeps for e in s.errors] + [
            f"concurrency {lv.max_concurrency}: {n} x {cause}" for s in sweeps for lv in s.levels
            for cause, n in lv.errors.items()
        ]  # fmt: skip
        fail("the benchmark is incomplete (partial result):\n  " + "\n  ".join(errors[:10]))


def _goodput_objective(goal: str | None) -> Objective | None:
    """The goodput objective `--goal` names; None without one; exit 2 for any other goal (a sweep
    has no objective: `bench compare --goal` judges one)."""
    if goal is None:
        return None
    from tools.bench.objective import GoalError, objective_from_goal

    try:
        objective = objective_from_goal(goal)
    except GoalError as e:
        fail(str(e), code=2)
    if objective.kind != "goodput":
        fail(f"--goal here takes a goodput goal (a sweep has no objective), got {goal!r}: e.g. "
             "'maximize goodput with p99 TTFT under 300 ms and p99 TPOT under 40 ms'", code=2)  # fmt: skip
    return objective


def _run_with_progress(
    endpoint: str, settings: BenchConfig, cfg: Config, request_rate: float | None, prompt_file: Path | None
) -> list[SweepResult]:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from agent.live import LiveProgress
    from tools.bench.loadgen import Progress as LevelProgress
    from tools.bench.loadgen import run_repeated

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[tps]:>9.0f} tok/s"), TimeElapsedColumn())  # fmt: skip
    tasks: dict[tuple[int, int], int] = {}
    with LiveProgress(*columns, console=err_console, transient=False) as bar:

        def on_progress(p: LevelProgress) -> None:
            key = (p.rep, p.concurrency)
            if key not in tasks:
                label = f"rep {p.rep + 1}/{p.reps} c={p.concurrency}" if p.reps > 1 else f"c={p.concurrency}"
                tasks[key] = bar.add_task(label, total=p.total, tps=0.0)
            bar.update(tasks[key], completed=p.done, tps=p.tokens_per_s)

        if settings.backend == "sglang":
            from tools.bench.sglang_backend import run_sweep_sglang
            from tools.deploy.remote import make_transport

            err_console.print(f"running sglang.bench_serving with {cfg.target.python} on the host ...")

            async def go() -> list[SweepResult]:
                transport = make_transport(cfg.target)
                try:
                    return [
                        await run_sweep_sglang(
                            transport, endpoint, settings, python=cfg.target.python, seed=r
                        )
                        for r in range(settings.reps)
                    ]
                finally:
                    await transport.close()

            return asyncio.run(go())
        return asyncio.run(
            run_repeated(
                endpoint,
                settings,
                on_progress=on_progress,
                request_rate=request_rate,
                prompt_file=prompt_file,
            )
        )


_DIGITS = {"request_throughput": 2, "output_throughput": 0, "total_throughput": 0}


def _fmt(value: float | None, digits: int = 1) -> str:
    return "missing" if value is None else f"{value:.{digits}f}"


def _mean(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got and len(got) == len(values) else None


def _print_sweeps(sweeps: list[SweepResult]) -> None:
    levels = sorted({lv.max_concurrency for s in sweeps for lv in s.levels})
    if not levels:
        return
    title = f"{sweeps[0].endpoint} ({sweeps[0].api}), mean of {len(sweeps)} repetition(s), times in ms"
    table = Table(title=title)
    cols = ("conc", "ok/fail", "req/s", "out tok/s", "all tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
            "ITL p99", "E2E p50")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="right")
    fields = ("request_throughput", "output_throughput", "total_throughput", "median_ttft_ms", "p99_ttft_ms",
              "median_tpot_ms", "p99_itl_ms", "median_e2e_latency_ms")  # fmt: skip
    for c in levels:
        runs = [s.level(c) for s in sweeps]
        got = [lv for lv in runs if lv is not None]
        row = [str(c), f"{sum(lv.completed for lv in got)}/{sum(lv.failed for lv in got)}"]
        row += [
            _fmt(_mean([getattr(lv, f) if lv else None for lv in runs]), _DIGITS.get(f, 1)) for f in fields
        ]
        table.add_row(*row, style=None if all(lv and lv.ok for lv in runs) else "red")
    console.print(table)
    _print_turns(sweeps, levels)


def _print_turns(sweeps: list[SweepResult], levels: list[int]) -> None:
    """Per turn of a multi-turn workload: prompt length, the share the server found cached (where it
    reports cached tokens) and the time to first token, each the mean of the repetitions."""
    if not any(lv.turns for s in sweeps for lv in s.levels):
        return
    table = Table(title="per turn of the conversations, mean of the repetitions")
    for col in ("conc", "turn", "prompt tok", "cache hit", "TTFT p50"):
        table.add_column(col, justify="right")
    for c in levels:
        turns = [t for s in sweeps if (lv := s.level(c)) for t in lv.turns]
        for k in sorted({t.turn for t in turns}):
            got = [t for t in turns if t.turn == k]
            hit = _mean([t.cache_hit_rate for t in got])
            table.add_row(
                str(c), str(k + 1), _fmt(_mean([t.mean_input_tokens for t in got]), 0),
                "missing" if hit is None else f"{hit:.0%}", _fmt(_mean([t.median_ttft_ms for t in got])),
            )  # fmt: skip
    console.print(table)


@app.command("compare")
def compare_cmd(
    baseline: Path = typer.Argument(..., help="Baseline result JSON (one sweep or a list of repetitions)."),
    candidate: Path = typer.Argument(..., help="Candidate result JSON."),
    goal: str | None = typer.Option(
        None, "--goal", help='e.g. "maximize throughput", "p99 ttft at concurrency 8".'
    ),
    min_effect: float = typer.Option(0.02, "--min-effect", help="Smallest change that counts (0.02 = 2%)."),
    tolerance: float = typer.Option(0.03, "--tolerance", help="Largest regression allowed at any level."),
    launch_noise: float = typer.Option(
        0.01,
        "--launch-noise",
        min=0,
        max=0.99,
        help="Restart-to-restart spread (0.01 = 1%); 0 for one launch.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the decision as JSON."),
    plot_file: Path | None = typer.Option(None, "--plot", help="Save a before/after PNG plot."),
) -> None:
    """Decide whether CANDIDATE is better than BASELINE, with the numbers and the test used.
    \f

    One piece because it is a typer command read top to bottom: both files and the goal checked
    in the order they are given, one comparison, then its print-out (JSON or a table).
    """
    from tools.bench.objective import GoalError
    from tools.bench.stats import IncomparableResults, compare, objective_from_goal

    sides = []
    for path in (baseline, candidate):
        try:
            sides.append(load_sweeps(path))
        except FileNotFoundError:
            fail(f"{path}: no such file", code=2)
        except (ValueError, ValidationError) as e:
            fail(f"{path}: not a benchmark result: {str(e).splitlines()[0]}", code=2)
    try:
        objective = objective_from_goal(goal)
    except GoalError as e:
        fail(str(e), code=2)
    if objective.kind == "goodput":
        fail("a goodput goal is judged on rate curves, not on sweeps: `optagent bench --goal` measures one",
             code=2)  # fmt: skip
    try:
        result = compare(
            sides[0],
            sides[1],
            objective,
            min_effect=min_effect,
            regress_tolerance=tolerance,
            launch_noise=launch_noise,
        )
    except IncomparableResults as e:
        fail(f"cannot compare {baseline} with {candidate}: {e}", code=2)
    if plot_file:
        from tools.bench.plot import plot_sweeps

        plot_sweeps({baseline.stem: sides[0], candidate.stem: sides[1]}, plot_file)
    if as_json:
        console.print_json(result.model_dump_json())
        return
    colour = {"improved": "green", "regressed": "red", "no_change": "yellow", "inconclusive": "yellow"}[
        result.verdict
    ]
    console.print(f"[bold {colour}]{result.verdict}[/]  {result.summary.split(': ', 1)[1]}", highlight=False)
    console.print(f"method: {result.method}; min effect {min_effect:.0%}, level tolerance {tolerance:.0%}")
    table = Table(title=f"per level: {'+'.join(result.objective.metrics)}")
    for col in ("conc", "baseline", "candidate", "gain", "95% CI", "p", "verdict"):
        table.add_column(col, justify="right")
    for lc in result.per_level:
        ci = (
            "missing"
            if lc.ci_low is None
            else f"{(lc.ci_low - 1) * 100:+.1f}%..{(lc.ci_high - 1) * 100:+.1f}%"
        )
        change = "missing" if lc.ratio is None else f"{(lc.ratio - 1) * 100:+.1f}%"
        p = "missing" if lc.p_value is None else f"{lc.p_value:.3g}"
        table.add_row(str(lc.concurrency), _fmt(lc.baseline), _fmt(lc.candidate), change, ci, p, lc.verdict)
    console.print(table)
    for lc in result.per_level:
        if lc.note:
            console.print(f"concurrency {lc.concurrency}: {lc.note}", highlight=False)
    if plot_file:
        console.print(f"saved {plot_file}")
