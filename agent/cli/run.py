"""`optagent run`: plan, research, trial and keep what measurably helps."""

from __future__ import annotations

from pathlib import Path

import typer

from agent.cli.common import ConfigOption, fail


def run(
    goal: str = typer.Option("improve throughput", "--goal", "-g", help="What to optimize, in plain words."),
    config: Path | None = ConfigOption,
    model: str | None = typer.Option(None, "--model", help="pydantic-ai model name, or 'builtin'."),
    base_url: str | None = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint for the model."),
    max_trials: int | None = typer.Option(None, "--max-trials", help="At most this many trials."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before changing the target."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Plan and research; deploy nothing."),
    allow_lossy: bool = typer.Option(
        False, "--allow-lossy", help="Allow keeping changes that alter outputs."
    ),
) -> None:
    """Plan, research and trial server flags; keep only what is measurably better."""
    fail("not implemented yet")
