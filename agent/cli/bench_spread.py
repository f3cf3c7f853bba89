"""`optagent bench --restarts N`: how far known-good moves between launches, recorded in the config.

The running launch of known-good is measured, then it is relaunched N times through the one gate
every trial uses (`agent.trial.spread.relaunch_known_good`: a marked copy of the unit file deployed,
then the rollback, in turn; restart, wait healthy, the probe's warm-up, a block of `bench.reps`
sweeps). The spread of those N + 1 launches, by the statistics a run applies to its own relaunches
(`agent.trial.spread.spread_of_blocks`), is printed and written into the config file as
`bench.launch_spread` and `launch_spread_df` (N): `optagent run` then uses it without relaunching.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.cli.common import console, err_console, fail, run_on_target, target_config
from tools.config import CONFIG_NAME, BenchConfig, ConfigError, record_settings


def check_restarts(restarts: int, settings: BenchConfig, unused: dict[str, object]) -> None:
    """Exit 2 before any restart when `--restarts` cannot give a spread with these options."""
    if restarts < 2:
        fail(
            f"--restarts must be at least 2, got {restarts}: the spread needs at least three launches "
            "(the running one and two relaunches)",
            code=2,
        )
    if settings.reps < 2:
        fail("--restarts needs at least 2 repetitions per launch (--reps): the spread is what the "
             "launches differ by beyond their repetitions", code=2)  # fmt: skip
    given = [name for name, value in unused.items() if value not in (None, False)]
    if given:
        fail(f"--restarts measures through the deployment in the config; {', '.join(given)} "
             "cannot be used with it", code=2)  # fmt: skip


def record_spread(config: Path | None, settings: BenchConfig, restarts: int) -> None:
    """Measure known-good on its running launch and `restarts` relaunches, print the launch spread,
    and record it in the config file in use (`--config`, else ./optagent.toml; the simulated default
    has none: the figure is printed only). Nothing is written unless every launch measured whole;
    a failed relaunch has already rolled back to known-good."""
    cfg = target_config(config)
    path = config if config is not None else None if cfg.simulated else Path(CONFIG_NAME)
    blocks, restarted, why = run_on_target(_measure(cfg, settings, restarts))
    for i, block in enumerate(blocks):
        console.print(f"launch {i + 1}: {_levels_line(block)}", highlight=False)
    if why:
        fail(f"{why}; known-good is deployed ({restarted} restarts); nothing was recorded")
    from agent.trial.spread import spread_of_blocks, unsteady
    from tools.bench.objective import Objective

    spread = spread_of_blocks(blocks, Objective(), settings.launch_noise)  # the default: every level
    levels = ", ".join(f"c={c} {v:.1%}" for c, v in (spread.per_level or {}).items())
    console.print(
        f"launch spread: {spread.measured:.2%} over {spread.launches} launches of known-good ({levels}; "
        f"{spread.df:g} degrees of freedom; {restarted} restarts)",
        highlight=False,
    )
    if why := unsteady(spread):
        fail(f"{why}; known-good is deployed ({restarted} restarts); nothing was recorded")
    if path is None:
        console.print(
            "not recorded: the simulated default has no optagent.toml; name one with --config to record "
            f"launch_spread = {spread.measured:.4f}, launch_spread_df = {spread.df:g}",
            highlight=False,
        )
        return
    try:
        record_settings(
            path, "bench", {"launch_spread": round(spread.measured, 4), "launch_spread_df": int(spread.df)}
        )
    except ConfigError as e:
        fail(str(e))
    console.print(f"recorded in {path} [bench]: launch_spread = {spread.measured:.4f}, "
                  f"launch_spread_df = {spread.df:g} (a run uses it instead of relaunching)", highlight=False)  # fmt: skip


async def _measure(cfg: Any, settings: BenchConfig, restarts: int) -> tuple[list[list[Any]], int, str]:
    """(a block per launch, the restarts spent, why it stopped short or "")."""
    from agent.trial.record import Baseline
    from agent.trial.runner import TrialRunner
    from agent.trial.spread import launch_block, relaunch_known_good
    from tools.bench.objective import Objective
    from tools.deploy.deployment import Deployment
    from tools.deploy.health import wait_healthy

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind == "block" and data.get("state") == "start":
            err_console.print(f"[dim]measuring {data['label']} ...[/]", highlight=False)

    async with Deployment(cfg.target, command="optagent bench --restarts", pace=True) as d:
        if d.recovered:
            console.print(f"[yellow]recovered:[/] {d.recovered}", highlight=False)
        runner = TrialRunner(
            deployment=d, endpoint=cfg.target.endpoint, bench=settings, objective=Objective(),
            baseline=Baseline(reps=[], probe=None, text=await d.known_good()), on_event=on_event,
        )  # fmt: skip
        health = await wait_healthy(cfg.target.endpoint, timeout=cfg.target.health_timeout_s)
        if not health.ok:
            return [], 0, f"known-good is not healthy: {health.reason}"
        first, why = await launch_block(runner, "the running launch")
        if why:
            return [], 0, why
        relaunched, why = await relaunch_known_good(runner, restarts, label="relaunch")
        return [first, *relaunched], runner.restarts, why


def _levels_line(block: list[Any]) -> str:
    from agent.trial.record import mean_throughput

    return ", ".join(f"c={c} {v:,.1f} tok/s" for c, v in mean_throughput(block).items())
