"""`optagent deploy | rollback | status | recover`: change the target safely."""

from __future__ import annotations

from pathlib import Path

import typer

from agent.cli.common import ConfigOption, fail


def deploy(
    config: Path | None = ConfigOption,
    set_: list[str] = typer.Option([], "--set", help="FLAG[=VALUE] to set (repeatable)."),
    unset: list[str] = typer.Option([], "--unset", help="FLAG to remove (repeatable)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the diff; touch nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Change server flags: edit, upload, restart, wait healthy, or roll back."""
    fail("not implemented yet")


def rollback(config: Path | None = ConfigOption) -> None:
    """Restore the known-good configuration."""
    fail("not implemented yet")


def status(config: Path | None = ConfigOption) -> None:
    """Show deployed flags, health, lock, journal state and known-good version."""
    fail("not implemented yet")


def recover(config: Path | None = ConfigOption) -> None:
    """Finish or undo an interrupted deploy."""
    fail("not implemented yet")
