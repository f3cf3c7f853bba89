"""`optagent chat`: talk to the planner and steer it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from agent.cli.common import ConfigOption, check_transcripts_dir, fail, fail_locked, get_config


def chat(
    config: Path | None = ConfigOption,
    model: str | None = typer.Option(None, "--model", help="pydantic-ai model name, or 'builtin'."),
    base_url: str | None = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint for the model."),
    resume: str | None = typer.Option(None, "--resume", help="Continue a saved chat or run (id or prefix)."),
    goal: str = typer.Option("improve throughput", "--goal", "-g", help="What the session is for."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before changing the target."),
) -> None:
    """Talk to the optimization agent interactively.
    \f

    One piece because it is a typer command read top to bottom: options, a resumed or new
    transcript, then the chat loop, whose `main()` closes over that transcript and the `spent`
    counters that every way out records when it closes the transcript.
    """
    from agent.chat.session import ChatSession, line_reader
    from agent.chat.setup import chat_console, open_chat
    from agent.policy.models import ModelChoiceError, choose_model
    from agent.transcripts.load import TranscriptNotFound, find_transcript, load_transcript
    from agent.transcripts.transcript import Transcript
    from agent.ui import RunUI
    from tools.deploy.lock import LockedError

    cfg = get_config(config)
    check_transcripts_dir(cfg)
    if cfg.simulated and config is None:
        from agent.cli.run import sim_config  # the simulated deployment, started if needed

        cfg = sim_config(config)
    from agent.cli.run import read_goal_option

    try:
        name, url = choose_model(model, base_url, configured=cfg.agent.model)
    except ModelChoiceError as e:
        fail(str(e), code=2)
    loaded = None
    if resume is not None:
        try:
            path = find_transcript(resume, cfg.agent.transcripts_dir)
            loaded = load_transcript(path)
            transcript = Transcript.resume(path)
        except (TranscriptNotFound, OSError, ValueError) as e:
            fail(str(e), code=2)
        # the session goes on with its own goal, read as it was when it began (never refused now)
        saved_goal = str(transcript.header.get("goal") or "improve throughput")
        cfg, read, chosen = read_goal_option(saved_goal, cfg, strict=False)
    else:
        cfg, read, chosen = read_goal_option(goal, cfg)
        label = name if not url else f"{name} @ {url}"
        transcript = Transcript.create(
            cfg.agent.transcripts_dir,
            kind="chat",
            goal=goal,
            model=label,
            target=cfg.target.endpoint,
            config=cfg,
        )
    console = chat_console()
    console.print(chosen, highlight=False, markup=False)  # the goal's words: no markup
    ui = RunUI(console=console, transcript=transcript)
    console.print(f"session {transcript.id} (saved to {transcript.path})", highlight=False)

    spent: dict[str, int] = {}  # the counters a later --resume carries over (see restore_state)

    async def main() -> str:
        async with open_chat(cfg, goal=read, model=name, base_url=url, ui=ui, resume=loaded) as setup:
            session = ChatSession(
                setup.planner,
                setup.deps,
                transcript,
                console,
                line_reader(console),
                yes=yes,
                instructions=setup.instructions,
                history=setup.history,
            )
            try:
                return await session.loop()
            finally:
                if setup.deps.runner is not None:
                    spent["restarts"] = setup.deps.runner.restarts

    status = "error"
    try:
        status = asyncio.run(main())
    except KeyboardInterrupt:
        status = "interrupted"
    except LockedError as e:  # another optagent works on the target: this chat never started
        fail_locked(e, transcript, resumed=resume is not None)
    except Exception as e:
        transcript.close({"status": f"failed: {type(e).__name__}: {e}", **spent})
        fail(f"{type(e).__name__}: {e}")
    transcript.close({"status": status, "kept": _kept(transcript.path), **spent})
    console.print(
        f"saved {transcript.id}; resume with: optagent chat --resume {transcript.id}", highlight=False
    )


def _kept(path: Path) -> list[str]:
    """The flags deployed beyond the baseline at the end, from the recorded trials."""
    from agent.transcripts.load import load_transcript
    from agent.transcripts.review import build_review

    return build_review(load_transcript(path)).kept
