"""`optagent chat`: the builtin chat policy and the session loop (approval gate, slash commands)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic_ai.models.function import FunctionModel
from rich.console import Console

from agent.chat.policy import chat_policy, parse_change
from agent.chat.session import ChatSession
from agent.context import DeploymentContext
from agent.policy.builtin.policy import researcher_policy
from agent.policy.planner import PlannerDeps, build_planner
from agent.policy.researcher import build_researcher
from agent.transcripts.load import load_transcript
from agent.transcripts.transcript import Transcript
from agent.ui import RunUI
from tools.bench.objective import Goal
from tools.flagname import flag_dest, flag_name


def test_every_spelling_of_a_flag_names_one_flag() -> None:
    """With or without its dashes, with `_` or `-`: one name, one argparse destination, wherever
    the flag comes from (a chat line, a tool call, the command line)."""
    from agent.cli.common import normalize_flag

    spellings = [
        "mem-fraction-static",
        "--mem-fraction-static",
        "mem_fraction_static",
        " --mem_fraction_static ",
    ]
    assert {flag_name(s) for s in spellings} == {"--mem-fraction-static"}
    assert {normalize_flag(s) for s in spellings} == {"--mem-fraction-static"}
    assert {flag_dest(s) for s in spellings} == {"mem_fraction_static"}
    assert flag_name("--no-enable-x") == "--no-enable-x"


def test_parse_change() -> None:
    assert parse_change("try --cuda-graph-max-bs 128") == {
        "flag": "--cuda-graph-max-bs",
        "value": "128",
        "action": "set",
    }
    assert parse_change("try mem_fraction_static=0.9 please") == {
        "flag": "--mem-fraction-static",
        "value": "0.9",
        "action": "set",
    }
    assert parse_change("try --enable-torch-compile anyway") == {
        "flag": "--enable-torch-compile",
        "value": None,
        "action": "set",
    }
    assert parse_change("unset --disable-radix-cache")["action"] == "unset"
    assert parse_change("try") is None


def _dry_session(tmp_path: Path, lines: list[str]) -> tuple[ChatSession, Transcript, list[str]]:
    """A chat with the real planner and researcher agents and no trial runner (nothing deploys)."""
    feed = iter(lines)
    asked: list[str] = []

    async def ask(prompt: str) -> str | None:
        asked.append(prompt)
        return next(feed, None)

    console = Console(width=200, record=True)
    t = Transcript.create(tmp_path, kind="chat", goal="improve throughput", model="builtin", target="sim")
    ui = RunUI(console=console, transcript=t)
    researcher = build_researcher(FunctionModel(researcher_policy))
    deps = PlannerDeps(
        goal=Goal(), ctx=DeploymentContext(), candidates=[], ui=ui, researcher=researcher, runner=None
    )
    planner = build_planner(FunctionModel(chat_policy))
    return ChatSession(planner, deps, t, console, ask), t, asked


def test_dry_chat_session_records_research_approvals_and_commands(tmp_path: Path) -> None:
    lines = [
        "research --enable-torch-compile",
        "try --cuda-graph-max-bs 128",
        "n",
        "try --cuda-graph-max-bs 128",
        "y",
        "/todo",
        "/help",
        "what?",
        "/bogus",
        "/exit",
        "never read",
    ]
    session, t, asked = _dry_session(tmp_path, lines)
    assert asyncio.run(session.loop()) == "exit"
    t.close({"status": "exit"})
    out = session.console.export_text()
    assert "--enable-torch-compile: unknown" in out
    assert (
        "declined: the target is not changed" in out and "dry run: would trial --cuda-graph-max-bs 128" in out
    )
    assert out.count("dry run: would trial --cuda-graph-max-bs 128") == 1  # not again in the reply
    assert (
        "/rollback  undo the last kept change" in out and "I understand: 'what would you try first?'" in out
    )
    assert "unknown command /bogus" in out
    assert asked.count("apply this change to the target? [y/N] ") == 2

    loaded = load_transcript(t.path)
    approvals = loaded.events_of("approval")
    assert [a["data"]["approved"] for a in approvals] == [False, True]
    assert loaded.events_of("verdict")[0]["data"]["flag"] == "--enable-torch-compile"
    subagent = [m for m in loaded.messages if m["agent"] == "researcher:--enable-torch-compile"]
    assert subagent and all(m["parent"] == 2 for m in subagent)
    spawner = next(m for m in loaded.messages if m["agent"] == "researcher:--cuda-graph-max-bs")["parent"]
    assert next(m for m in loaded.messages if m["msg"] == spawner)["parts"][0]["tool_name"] == "research_flag"
    # the saved planner history reloads and continues the conversation
    history = loaded.model_messages()
    session2, t2, _ = _dry_session(tmp_path, ["benchmark", "/exit"])
    session2.history = history
    asyncio.run(session2.loop())
    assert "dry run: nothing to measure" in session2.console.export_text()
    assert len(session2.history) == len(history) + 4


def test_end_of_input_leaves_the_chat(tmp_path: Path) -> None:
    session, t, _ = _dry_session(tmp_path, ["", "status"])
    assert asyncio.run(session.loop()) == "end of input"
    assert "dry run: nothing is deployed by this session" in session.console.export_text()
