"""`optagent sim`: the simulated SGLang deployment."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from agent.cli.common import console, fail
from sim.real.layout import DEFAULT_REAL_DIR
from tools.config import DEFAULT_SIM_DIR

app = typer.Typer(help=__doc__, no_args_is_help=True)

DirOption = typer.Option(DEFAULT_SIM_DIR, "--dir", help="Directory of the simulated host.")


@app.command("up")
def up(
    scenario: str = typer.Option("seed", "--scenario", help="Bundled scenario name or a scenario TOML file."),
    sim_dir: Path | None = typer.Option(
        None,
        "--dir",
        help=f"Directory of the host (default {DEFAULT_SIM_DIR}, with --real {DEFAULT_REAL_DIR}).",
    ),
    port: int | None = typer.Option(None, "--port", min=1, max=65535, help="Port (default 30000 if free)."),
    time_scale: float | None = typer.Option(
        None, "--time-scale", min=0.0001, help="Wall seconds per simulated second (default: the scenario's)."
    ),
    real: bool = typer.Option(
        False, "--real", help="A real SGLang 0.5.23 server on this machine's CPU (sets up ~7 GB once)."
    ),
) -> None:
    """Lay out and start the simulated deployment (or a real one with --real), wait until healthy."""
    from sim import host
    from sim.scenario import ScenarioError

    if real:
        _up_real(sim_dir or DEFAULT_REAL_DIR, port)
        return
    sim_dir = sim_dir or DEFAULT_SIM_DIR
    try:
        running = host.status(sim_dir)["running"]
        if running and (port is not None or time_scale is not None or scenario != "seed"):
            console.print("[yellow]already running; --scenario/--port/--time-scale apply after `sim down`[/]")
        elif not running and (port is not None or time_scale is not None or scenario != "seed"):
            host.create(sim_dir, scenario=scenario, port=port, time_scale=time_scale)
        with console.status("starting the simulated SGLang server..."):
            config = host.ensure_up(sim_dir, scenario=scenario, port=port, time_scale=time_scale)
    except ScenarioError as e:
        fail(str(e), code=2)
    except host.SimHostError as e:
        fail(str(e))
    target = config.target
    console.print(f"[green]healthy[/] endpoint: {target.endpoint}")
    console.print(f"unit file: {target.remote_unit}  (local copy: {target.local_unit})", soft_wrap=True)
    console.print(f"service:   {target.service} (process manager, log in {target.run_dir})", soft_wrap=True)


def _up_real(host_dir: Path, port: int | None) -> None:
    """Set up the real SGLang environment (cached), lay out `host_dir` if new, start it, wait healthy."""
    from sim import host
    from sim.real import layout
    from sim.real.environment import EnvironmentSetupError, ensure_environment

    try:
        if not (host_dir / "sim.json").exists():
            env = ensure_environment(progress=lambda text: console.print(f"[dim]{text}[/]"))
            layout.create(host_dir, env, port=port)
        elif port is not None:
            console.print(
                "[yellow]already laid out; --port applies after `sim down` and removing the directory[/]"
            )
        with console.status("starting SGLang on the CPU (about 20 s)..."):
            config = host.ensure_up(host_dir)
    except (EnvironmentSetupError, host.SimHostError) as e:
        fail(str(e))
    target = config.target
    console.print(f"[green]healthy[/] endpoint: {target.endpoint}  (a real SGLang server on the CPU)")
    console.print(f"unit file: {target.remote_unit}  (local copy: {target.local_unit})", soft_wrap=True)
    console.print(
        f'next: optagent run --config {host_dir / "optagent.toml"} --goal "improve throughput"',
        soft_wrap=True,
    )


@app.command("down")
def down(sim_dir: Path = DirOption) -> None:
    """Stop the simulated server."""
    from sim import host

    was = host.down(sim_dir)
    console.print("stopped" if was else f"not running ({sim_dir})")


@app.command("status")
def status(
    sim_dir: Path = DirOption, as_json: bool = typer.Option(False, "--json", help="Print JSON.")
) -> None:
    """Report whether the simulated server is laid out, running and healthy."""
    from sim import host

    info = host.status(sim_dir)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    if not info["exists"]:
        console.print(f"no simulated host in {info['dir']} (run `optagent sim up`)")
        raise typer.Exit(1)
    state = "healthy" if info["healthy"] else ("running, not healthy" if info["running"] else "stopped")
    console.print(f"{state}  scenario={info['scenario']}  endpoint={info['endpoint']}  pid={info['pid']}")
    console.print(
        f"unit file: {info['unit']}  service: {info['service']}  log: {info['log']}", soft_wrap=True
    )
