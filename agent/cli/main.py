"""optagent: make a production SGLang server faster without ever leaving it broken."""

from __future__ import annotations

import os

import typer

# pydantic-ai prints a Logfire advertisement on the first agent run in a terminal; the product's
# output is ours (its documented switch, read at each run; subprocesses inherit it)
os.environ.setdefault("PYDANTIC_AI_NO_BANNER", "1")

from agent.cli import bench, chat, deploy, init, research, run, sim, transcripts  # noqa: E402


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"optagent {version('optagent')}")
        except PackageNotFoundError:
            typer.echo("optagent (not installed: running from a source tree)")
        raise typer.Exit()


app = typer.Typer(
    help=__doc__,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """optagent: make a production SGLang server faster without ever leaving it broken."""


app.command("run")(run.run)
app.command("chat")(chat.chat)
app.add_typer(transcripts.app, name="transcripts")
app.add_typer(bench.app, name="bench")
app.command("deploy")(deploy.deploy)
app.command("rollback")(deploy.rollback)
app.command("status")(deploy.status)
app.command("recover")(deploy.recover)
app.command("flags")(research.flags)
app.command("research", context_settings=research.CONTEXT)(research.research)
app.add_typer(sim.app, name="sim")
app.command("init")(init.init)
