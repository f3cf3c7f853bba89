"""Pieces every command module shares: the console, config loading and exiting with a clear error."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from tools.auth import export_api_key
from tools.config import Config, ConfigError, load_config

console = Console()
err_console = Console(stderr=True)

ConfigOption = typer.Option(
    None, "--config", "-c", help="optagent.toml (default: ./optagent.toml or the simulated deployment)."
)


def fail(message: str, *, code: int = 1) -> NoReturn:
    """Print `message` on stderr and exit with `code` (1: the work failed, 2: bad usage or input)."""
    err_console.print("[bold red]error:[/] " + escape(message), highlight=False)
    raise typer.Exit(code)


def get_config(path: Path | None) -> Config:
    """Load the config or exit with status 2 naming the bad key."""
    try:
        config = load_config(path)
    except ConfigError as e:
        fail(str(e), code=2)
    export_api_key(config.target.api_key)  # every request of this process sends it; transcripts hide it
    return config


def normalize_flag(flag: str) -> str:
    """`mem-fraction-static`, `--mem-fraction-static` and `mem_fraction_static` all mean `--mem-fraction-static`."""
    name = flag.strip().lstrip("-").replace("_", "-")
    if not name:
        raise typer.BadParameter(f"not a flag name: {flag!r}")
    return f"--{name}"
