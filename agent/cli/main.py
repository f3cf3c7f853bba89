"""optagent: make a production SGLang server faster without ever leaving it broken."""

from __future__ import annotations

import typer

from agent.cli import bench, chat, deploy, init, research, run, sim, transcripts

app = typer.Typer(
    help=__doc__,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

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
