"""`optagent transcripts`: list, show, review and export saved sessions."""

from __future__ import annotations

import typer

app = typer.Typer(help=__doc__, no_args_is_help=True)
