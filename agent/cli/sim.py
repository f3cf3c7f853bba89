"""`optagent sim`: the simulated SGLang deployment."""

from __future__ import annotations

import typer

app = typer.Typer(help=__doc__, no_args_is_help=True)
