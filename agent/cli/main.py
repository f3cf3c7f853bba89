"""optagent: make a production SGLang server faster without ever leaving it broken."""

from __future__ import annotations

import difflib
import importlib
import os
from typing import Any, NamedTuple

import typer
from typer.core import TyperCommand, TyperGroup

# pydantic-ai prints a Logfire advertisement on the first agent run in a terminal; the product's
# output is ours (its documented switch, read at each run; subprocesses inherit it)
os.environ.setdefault("PYDANTIC_AI_NO_BANNER", "1")


class Entry(NamedTuple):
    """Where a command lives and its one-line help (the first line of its docstring)."""

    module: str
    name: str
    help: str
    context: str | None = None
    """The module's attribute holding the command's click context settings."""


COMMANDS = {
    "run": Entry("agent.cli.run", "run", "Plan, research and trial server flags; keep only what is measurably better."),
    "chat": Entry("agent.cli.chat", "chat", "Talk to the optimization agent interactively."),
    "transcripts": Entry("agent.cli.transcripts", "app", "`optagent transcripts`: list, show, review and export saved sessions."),
    "bench": Entry("agent.cli.bench", "app", "`optagent bench`: concurrency sweeps, comparisons and plots."),
    "deploy": Entry("agent.cli.deploy", "deploy", "Change server flags: edit, upload, restart, wait healthy, or roll back."),
    "rollback": Entry("agent.cli.deploy", "rollback", "Restore the known-good configuration."),
    "status": Entry("agent.cli.deploy", "status", "Show deployed flags, health, lock, journal state and known-good version."),
    "recover": Entry("agent.cli.deploy", "recover", "Finish or undo an interrupted deploy."),
    "flags": Entry("agent.cli.research", "flags", "List every launch_server flag of an SGLang version."),
    "research": Entry("agent.cli.research", "research",
                      "The verdict of a flag on this deployment, from the code of the running SGLang version.",
                      "CONTEXT"),
    "sim": Entry("agent.cli.sim", "app", "`optagent sim`: the simulated SGLang deployment."),
    "cache": Entry("agent.cli.cache", "app", "`optagent cache`: what optagent keeps on disk, and removing it."),
    "init": Entry("agent.cli.init", "init", "Write a commented optagent.toml describing a real target, to edit."),
}  # fmt: skip
"""Every command, imported only when it runs: `optagent --help` lists these lines without importing
pydantic, the config, the benchmark or the agent stack."""


def load_command(name: str) -> Any:
    """The click command of `name`, built from its module (imported now)."""
    entry = COMMANDS[name]
    module = importlib.import_module(entry.module)
    target = getattr(module, entry.name)
    if isinstance(target, typer.Typer):
        command = typer.main.get_command(target)
    else:
        single = typer.Typer()
        context = getattr(module, entry.context) if entry.context else None
        single.command(name, context_settings=context)(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


class LazyGroup(TyperGroup):
    """A command group that imports a command's module only when that command runs; its help lists
    the commands from `COMMANDS` without importing any, and a mistyped command gets the close ones."""

    listing = False

    def __init__(self, **attrs: Any) -> None:
        # typer's own suggestions come from the commands already imported (none, here): ours below
        super().__init__(**{**attrs, "suggest_commands": False})

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=3, cutoff=0.6)
            if close:
                ctx.fail(f"No such command '{name}'. Did you mean {' or '.join(f'`{c}`' for c in close)}?")
        return super().resolve_command(ctx, args)

    def list_commands(self, ctx: Any) -> list[str]:
        return [*COMMANDS, *(n for n in self.commands if n not in COMMANDS)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return self.commands.get(cmd_name)
        if self.listing:
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name].help)
        self.commands[cmd_name] = load_command(cmd_name)
        return self.commands[cmd_name]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"optagent {version('optagent')}")
        except PackageNotFoundError:
            typer.echo("optagent (not installed: running from a source tree)")
        raise typer.Exit()


app = typer.Typer(
    cls=LazyGroup,
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
