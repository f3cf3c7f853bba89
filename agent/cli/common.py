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


def one_line(message: str, *, simulated: bool = False) -> str:
    """An error for a person: one line, no traceback text (its last line, the error, is kept), and
    for the simulated target the command that shows whether its server runs."""
    text = str(message)
    if "Traceback (most recent call last)" in text:
        head, _, trace = text.partition("Traceback (most recent call last)")
        last = [line.strip() for line in trace.splitlines() if line.strip()][-1:]
        text = " ".join([head.strip().rstrip(":"), *last]).strip()
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    down = ("not healthy", "cannot reach", "ConnectError", "Connection refused", "connect call failed")
    if simulated and any(w.lower() in text.lower() for w in down):
        text += "; is the server running? `optagent sim status`"
    return text


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
