"""`optagent deploy | rollback | status | recover`: change the target safely."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer

from agent.cli.common import (
    ConfigOption,
    confirm,
    console,
    err_console,
    fail,
    get_config,
    normalize_flag,
    run_on_target,
    target_config,
)
from tools.config import Config

T = TypeVar("T")


def _edits(set_: list[str], unset: list[str]) -> list[tuple[str, str, str | None]]:
    edits: list[tuple[str, str, str | None]] = []
    for item in set_:
        name, eq, value = item.partition("=")
        edits.append(("set", normalize_flag(name), value if eq else None))
    edits += [("unset", normalize_flag(flag), None) for flag in unset]
    if not edits:
        fail("nothing to change: give --set FLAG[=VALUE] or --unset FLAG", code=2)
    return edits


def _check_flags(cfg: Config, edits: list[tuple[str, str, str | None]]) -> None:
    """Exit 2 when the running version's catalog says an edit would not start; before any restart."""
    from tools.deploy.flagbounds import value_problems
    from tools.deploy.flagcheck import check_edits
    from tools.deploy.remote import TransportError, make_transport
    from tools.research.flags import flag_catalog
    from tools.research.source import SourceError, detect_version, get_source, local_source

    research = cfg.research
    bounds = value_problems({flag: value for op, flag, value in edits if op == "set"})
    if bounds:  # fixed ranges: no catalog needed
        fail("\n".join(bounds), code=2)

    async def version() -> str:
        transport = make_transport(cfg.target)
        try:
            return await detect_version(cfg.target.endpoint, transport=transport, python=cfg.target.python)
        finally:
            await transport.close()

    try:
        if research.source_dir is not None:
            tree = local_source(research.source_dir, version=research.version)
        else:
            from agent.ui import RunUI

            v = research.version or asyncio.run(version())
            with RunUI(err_console).waiting() as say:  # a first fetch of a version: tens of seconds
                tree = get_source(v, repo_url=research.repo_url, cache_dir=research.cache_dir, progress=say)
        catalog = flag_catalog(tree)
    except (SourceError, TransportError, OSError) as e:  # no catalog: deploy still rolls back a bad flag
        err_console.print(f"[yellow]warning:[/] flags not checked against the catalog: {e}", highlight=False)
        return
    problems = check_edits(catalog, edits, version=tree.version)
    if problems:
        fail("\n".join(problems), code=2)


def _apply(
    text: str, kind: str, edits: list[tuple[str, str, str | None]], *, env: dict[str, str] | None = None
) -> str:
    """The candidate text; a bad flag or value exits with status 2 before anything reaches the host.
    `env`: the unit's `EnvironmentFile=` variables, read on the host (what its `$NAME`s hold)."""
    from tools.deploy.units.file import UnitFile, UnitFileError

    try:
        unit = UnitFile.parse(text, kind=kind, env=env)  # type: ignore[arg-type]
        for op, flag, value in edits:
            unit = unit.set_flag(flag, value) if op == "set" else unit.unset_flag(flag)
    except UnitFileError as e:
        fail(str(e), code=2)
    return unit.render()


@contextmanager
def _progress_bar():  # type: ignore[no-untyped-def]
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from agent.live import LiveProgress

    with LiveProgress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console, transient=True
    ) as progress:
        task = progress.add_task("deploy", total=None)

        def update(phase: str, elapsed: float, total: float | None) -> None:
            labels = {"wait:health": "waiting for /health", "wait:generate": "generating one token"}
            progress.update(task, description=labels.get(phase, phase), completed=elapsed, total=total)

        yield update


def _secret(text: str, cfg: Config | None = None) -> str:
    """`text` with the API key and secret-named values replaced (as transcripts have them)."""
    from tools.redact import redact_text

    return redact_text(text, secrets=[cfg.target.api_key if cfg else None])


def _print_outcome(outcome: Any, what: str, cfg: Config | None = None) -> None:
    if outcome.ok:
        health = f" (healthy after {outcome.health.seconds:.1f}s)" if outcome.health else ""
        steps = ", ".join(f"{k} {v:.2f}s" for k, v in outcome.timings.items() if k != "total")
        console.print(
            f"[green]{what}[/] in {outcome.seconds:.1f}s{health}" + (f" [dim]({steps})[/]" if steps else "")
        )
        return
    # a failure goes to stderr, as every other error; its text is the host's, never markup
    from rich.text import Text

    err_console.print(
        Text.assemble((f"{what} failed: ", "red"), _secret(outcome.error, cfg)), highlight=False
    )
    if outcome.rolled_back and outcome.restored:
        err_console.print("the known-good configuration was restored")
    elif outcome.rolled_back:  # never together with "restored": it is not serving
        err_console.print(
            "[red bold]the known-good configuration was put back but is NOT serving: check the host[/]"
        )
    if outcome.log_tail:
        err_console.print("[bold]last log lines:[/]")
        err_console.print(_secret(outcome.log_tail, cfg), markup=False, highlight=False)


def deploy(
    config: Path | None = ConfigOption,
    set_: list[str] = typer.Option([], "--set", help="FLAG[=VALUE] to set (repeatable)."),
    unset: list[str] = typer.Option([], "--unset", help="FLAG to remove (repeatable)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the diff; touch nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Change server flags: edit, upload, restart, wait healthy, or roll back.
    \f

    One piece because it is a typer command whose two paths, `--dry-run` (read-only: no lock, no
    writes) and the real deploy, share the edits and checks made first; each nested coroutine
    closes over the same target, unit kind and edits.
    """
    from tools.deploy.deployment import Deployment
    from tools.deploy.units.file import unified_diff

    edits = _edits(set_, unset)
    if not dry_run and not yes and not sys.stdin.isatty():  # bad usage: before the lock or the host
        fail("no terminal to confirm on: add --yes to deploy without asking", code=2)
    cfg = target_config(config)
    target = cfg.target
    kind = "script" if target.remote_unit.endswith(".sh") else "systemd"
    _check_flags(cfg, edits)

    if dry_run:  # read-only: no lock, no recovery, no writes anywhere
        from tools.deploy.journal import DamagedStateError, Journal, read_state

        async def read_known_good() -> tuple[str, dict[str, str] | None]:
            from tools.deploy.running import env_file_values
            from tools.deploy.units.file import UnitFile

            try:  # read only: a damaged copy is left where it is (the next real deploy sets it aside)
                recorded = read_state(Journal(target.state_dir).known_good_path)
            except DamagedStateError:
                recorded = None
            d = Deployment(target)
            try:
                if recorded is None and target.local_unit.exists():
                    recorded = target.local_unit.read_text()
                if recorded is None:
                    recorded = await d.transport.read_file(target.remote_unit)
                unit = UnitFile.parse(recorded, kind=kind)  # type: ignore[arg-type]
                if unit.kind == "script" or not unit.unknown_words:
                    return recorded, None
                return recorded, await env_file_values(d.transport, unit)  # what its `$NAME`s hold
            finally:
                await d.transport.close()

        current, env = run_on_target(read_known_good())
        candidate = _apply(current, kind, edits, env=env)
        diff = unified_diff(current, candidate, name=Path(target.remote_unit).name)
        console.print(_secret(diff, cfg), markup=False, highlight=False)
        console.print("[dim]dry run: nothing was changed[/]")
        return

    async def go() -> Any:
        with _progress_bar() as update:
            async with Deployment(target, on_progress=update, command="optagent deploy") as d:
                if d.recovered:
                    console.print(f"[yellow]recovered:[/] {_secret(d.recovered, cfg)}", highlight=False)
                current = await d.known_good()
                candidate = _apply(current, kind, edits, env=dict((await d.host_unit(current)).host_env))
                diff = unified_diff(current, candidate, name=Path(d.remote_unit).name)
                console.print(_secret(diff, cfg), markup=False, highlight=False)
                if candidate == current:
                    console.print("nothing to change")
                    return None
                if not yes and not confirm("Deploy this change?"):
                    fail("not confirmed (use --yes to deploy without asking)", code=1)
                outcome = await d.deploy(candidate, reason="optagent deploy " + " ".join(set_ + unset))
                if outcome.ok:
                    await d.commit()
                return outcome

    outcome = run_on_target(go())
    if outcome is not None:
        _print_outcome(outcome, "deployed and committed" if outcome.ok else "deploy", cfg)
        if not outcome.ok:
            raise typer.Exit(1)


def _session(cfg: Config, body: Callable[[Any], Awaitable[T]], *, command: str) -> T:
    from tools.deploy.deployment import Deployment

    async def go() -> T:
        async with Deployment(cfg.target, command=command) as d:
            if d.recovered:
                console.print(f"[yellow]recovered:[/] {_secret(d.recovered, cfg)}", highlight=False)
            return await body(d)

    return run_on_target(go())


def rollback(config: Path | None = ConfigOption) -> None:
    """Restore the known-good configuration."""

    async def body(d: Any) -> Any:
        return await d.rollback()

    cfg = target_config(config)
    outcome = _session(cfg, body, command="optagent rollback")
    if not outcome.changed:
        console.print(
            "nothing in flight: the host already runs the known-good configuration, and it is healthy"
        )
        return
    _print_outcome(outcome, "rolled back", cfg)
    if not outcome.ok:
        raise typer.Exit(1)


def status(
    config: Path | None = ConfigOption,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show deployed flags, health, lock, journal state and known-good version."""
    from tools.deploy.deployment import Deployment
    from tools.deploy.lock import LockedError

    cfg = get_config(config)

    async def go() -> dict[str, Any]:
        try:
            async with Deployment(cfg.target, command="optagent status") as d:
                info = await d.status()
                info["recovered"] = d.recovered
                return info
        except LockedError:  # someone else is deploying: look without touching
            d = Deployment(cfg.target)
            try:
                return await d.status()
            finally:
                await d.transport.close()

    info = run_on_target(go())
    unhealthy = not info["health"]["ok"]
    if as_json:
        print(_secret(json.dumps(info, indent=2, default=str), cfg))
        if unhealthy:
            raise typer.Exit(1)
        return
    from rich.table import Table

    table = Table(show_header=False, box=None)
    for key, value in info.items():
        if key == "deployed_flags" and isinstance(value, dict):
            value = "\n".join(f"{k} {v}" if v is not None else k for k, v in value.items())
        elif key == "health":
            value = "healthy" if value["ok"] else f"NOT healthy: {value['reason']}"
        table.add_row(key.replace("_", " "), "-" if value is None else _secret(str(value), cfg))
    console.print(table)
    if unhealthy:  # scripts and monitors read the exit status
        raise typer.Exit(1)


def recover(config: Path | None = ConfigOption) -> None:
    """Finish or undo an interrupted deploy."""

    async def body(d: Any) -> str | None:
        return d.recovered

    if _session(get_config(config), body, command="optagent recover") is None:
        console.print("nothing to recover")
