"""`optagent init`: write a commented optagent.toml to edit."""

from __future__ import annotations

from pathlib import Path

import typer

from agent.cli.common import console, fail
from tools.localfiles import write_text

EXAMPLE = Path(__file__).resolve().parent.parent / "optagent.example.toml"


def init(
    path: Path = typer.Option(Path("optagent.toml"), "--path", "-o", help="Where to write the file."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a commented optagent.toml describing a real target, to edit."""
    if path.exists() and not force:
        fail(f"{path} exists; use --force to overwrite it", code=2)
    try:
        write_text(path, EXAMPLE.read_text())
    except OSError as e:
        fail(f"cannot write {path}: {e}")
    console.print(f"wrote {path}: edit [bold]\\[target][/] (host, unit file, endpoint) before `optagent run`")
