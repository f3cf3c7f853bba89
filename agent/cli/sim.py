"""`optagent sim`: the simulated SGLang deployment."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from agent.cli.common import console, fail
from tools.config import DEFAULT_SIM_DIR

app = typer.Typer(help=__doc__, no_args_is_help=True)

DirOption = typer.Option(DEFAULT_SIM_DIR, "--dir", help="Directory of the simulated host.")


@app.command("up")
def up(
    scenario: str = typer.Option("seed", "--scenario", help="Bundled scenario name or a scenario TOML file."),
    sim_dir: Path = DirOption,
    port: int | None = typer.Option(None, "--port", min=1, max=65535, help="Port (default 30000 if free)."),
    time_scale: float | None = typer.Option(
        None, "--time-scale", min=0.0001, help="Wall seconds per simulated second (default: the scenario's)."
    ),
) -> None:
    """Lay out and start the simulated deployment, wait until healthy, print where it is."""
    from sim import host
    from sim.scenario import ScenarioError

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
