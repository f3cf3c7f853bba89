"""`optagent chat`: talk to the planner and steer it."""

from __future__ import annotations

from pathlib import Path

import typer

from agent.cli.common import ConfigOption, fail


def chat(
    config: Path | None = ConfigOption,
    model: str | None = typer.Option(None, "--model", help="pydantic-ai model name, or 'builtin'."),
    resume: str | None = typer.Option(None, "--resume", help="Continue a saved chat or run."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before changing the target."),
) -> None:
    """Talk to the optimization agent interactively."""
    fail("not implemented yet")
