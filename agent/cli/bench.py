"""`optagent bench`: concurrency sweeps, comparisons and plots."""

from __future__ import annotations

import typer

app = typer.Typer(help=__doc__)
