"""`optagent flags | research`: the flag catalog and a flag's definition, readers and guards."""

from __future__ import annotations

from pathlib import Path

import typer

from agent.cli.common import ConfigOption, fail


def flags(
    config: Path | None = ConfigOption,
    source: Path | None = typer.Option(
        None, "--source", help="SGLang source tree (git checkout or unpacked wheel)."
    ),
    version: str | None = typer.Option(None, "--version", help="SGLang version to fetch."),
    grep: str | None = typer.Option(None, "--grep", help="Only flags matching this text."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List every launch_server flag of an SGLang version."""
    fail("not implemented yet")


def research(
    flag: str = typer.Argument(..., help="The flag, with or without dashes."),
    config: Path | None = ConfigOption,
    source: Path | None = typer.Option(None, "--source", help="SGLang source tree."),
    model_config: Path | None = typer.Option(None, "--model-config", help="config.json or its directory."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Where a flag is defined, read and gated, against this model and these GPUs."""
    fail("not implemented yet")
