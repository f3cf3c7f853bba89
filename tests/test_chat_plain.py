"""`optagent chat` with the builtin policy: the plain first questions a user asks (issue 26 item 6),
the approval in words, and a model's invalid trial refused without asking (issue 26 item 1).

The real planner and researcher agents over the SGLang 0.5.23 source and its flag catalog; no
trial runner (a dry chat: nothing deploys)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic_ai.models.function import FunctionModel
from rich.console import Console

from agent.chat.policy import chat_policy
from agent.chat.session import ChatSession
from agent.context import DeploymentContext
from agent.policy.builtin.policy import researcher_policy
from agent.policy.planner import PlannerDeps, build_planner
from agent.policy.playbook import evaluate, load_playbook
from agent.policy.researcher import build_researcher
from agent.transcripts.load import load_transcript
from agent.transcripts.transcript import Transcript
from agent.ui import RunUI
from tools.bench.objective import read_goal

APPROVE = "apply this change to the target? [y/N] "


def _chat(
    tmp_path: Path, tree, lines: list[str], planner_model=None, researcher_model=None
) -> tuple[str, list[str], Path]:
    from tools.research.flags import flag_catalog

    ctx = DeploymentContext(version=tree.version, tree=tree)
    ctx.catalog = {"--" + f.name.lstrip("-").replace("_", "-"): f for f in flag_catalog(tree)}
    feed, asked = iter(lines), []

    async def ask(prompt: str) -> str | None:
        asked.append(prompt)
        return next(feed, None)

    console = Console(width=200, record=True)
    t = Transcript.create(tmp_path, kind="chat", goal="improve throughput", model="builtin", target="sim")
    deps = PlannerDeps(
        goal=read_goal("improve throughput"), ctx=ctx, candidates=evaluate(load_playbook(), ctx.facts, ctx.catalog),
        ui=RunUI(console=console, transcript=t),
        researcher=build_researcher(researcher_model or FunctionModel(researcher_policy)),
        runner=None,
    )  # fmt: skip
    session = ChatSession(build_planner(planner_model or FunctionModel(chat_policy)), deps, t, console, ask)
    asyncio.run(session.loop())
    t.close({"status": "test"})
    return console.export_text(), asked, t.path


def test_plain_first_questions_map_to_the_tools(tmp_path: Path, sglang_0523) -> None:
    out, asked, path = _chat(
        tmp_path,
        sglang_0523,
        [
            "what would you try on this server?",
            "list the candidates",
            "why not --enable-torch-compile?",
            "status",
            "undo",
            "try --turbo-mode-xyz 1",
            "try --cuda-graph-max-bs-decode 128",
            "n",
        ],
    )
    # "what would you try?" is answered with one first pick and its reason (it listed all 17)
    assert "optagent> First: " in out and "\nWhy: research says " in out, out
    assert out.count("I listed the playbook's candidates for this deployment.") == 1, out
    assert "--enable-torch-compile (" in out and "playbook candidates are worth researching here" in out
    assert "(the todo list is empty)" not in out and "I understand:" not in out
    assert "I researched --enable-torch-compile in the running version's source (the verdict is above)" in out
    assert "dry run: nothing is deployed by this session" in out and '"dry_run"' not in out
    assert "dry run: nothing was deployed" in out  # undo
    # the nonexistent flag: researched, then refused without an approval question, no restart
    assert "--turbo-mode-xyz is not a flag of sglang 0.5.23" in out
    # a valid change: the approval question says it in words (no Python repr)
    assert "approval needed: trial: set --cuda-graph-max-bs-decode to 128" in out and "[{'flag'" not in out
    assert asked.count(APPROVE) == 1
    tx = load_transcript(path)
    assert [e["data"]["check"] for e in tx.events_of("refusal")] == ["catalog"]
    assert tx.events_of("approval")[0]["data"]["what"].startswith(
        "trial: set --cuda-graph-max-bs-decode to 128"
    )
    # the research verdict is printed once (the reply says what was done, not the verdict again),
    # and so are its summary and a refusal (the replies repeated them)
    assert out.count("--enable-torch-compile: ") == 1
    for verdict in tx.events_of("verdict"):  # the first pick's research too: its reason does not repeat it
        summary = verdict["data"]["summary"]
        assert out.count(summary[:60]) == 1, summary
    assert out.count("--turbo-mode-xyz is not a flag of sglang 0.5.23") == 1


def _scripted_chat(body: dict) -> dict:
    """The scripted model of a chat: one request per user line, some of them hostile."""
    import json

    from tests.fixtures.openai_script import calls, say, tool_call

    names = {t["function"]["name"] for t in body.get("tools", [])}
    msgs = body["messages"]
    if "usage" in names:  # the researcher: a path traversal and an unknown tool first
        if not any(m["role"] == "tool" for m in msgs):
            return calls(
                tool_call("read_range", {"path": "../../../etc/passwd", "start": 1, "end": 2}, "r"),
                tool_call("shell", {"cmd": "id"}, "s"),
                tool_call("usage", {"flag": FLAG}, "u"),
            )
        usage = next(
            json.loads(m["content"]) for m in msgs if m["role"] == "tool" and "code_verdict" in m["content"]
        )
        verdict = {
            "flag": FLAG,
            "verdict": usage["code_verdict"],
            "summary": "the code",
            "decided_by": "code",
        }
        return calls(tool_call("final_result", verdict, "f"))
    last = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    user, after = msgs[last]["content"], msgs[last + 1 :]
    if after:  # a tool answered: say what came back
        return say("done: " + str(after[-1].get("content"))[:300])
    if user.startswith("what"):
        return calls(tool_call("list_candidates", {}, "c"))
    if user.startswith("research"):
        return calls(tool_call("research_flag", {"flag": FLAG}, "q"))
    if user == "try turbo":
        return calls(
            tool_call("run_trial", {"changes": [{"flag": "--turbo-mode-xyz"}], "reason": "fast"}, "t")
        )
    if user == "try it":
        change = {"flag": FLAG, "value": "128"}
        return calls(tool_call("run_trial", {"changes": [change], "reason": "research says it applies"}, "t"))
    return calls(tool_call("run_trial", {"changes": [], "reason": "x", "sudo": True}, "x"))  # extra argument


FLAG = "--cuda-graph-max-bs-decode"


def test_a_scripted_llm_chat_is_held_to_the_same_checks(tmp_path: Path, sglang_0523, monkeypatch) -> None:
    """Chat through the real openai client and HTTP: the unknown flag is refused without an approval
    question, the researcher's path traversal and unknown tool go back as retries, a valid trial is
    asked about once, extra arguments are a retry; the chat reaches its end."""
    from agent.policy.models import make_models
    from tests.fixtures.openai_script import ScriptedLLM

    monkeypatch.setenv("OPENAI_API_KEY", "none")
    with ScriptedLLM(_scripted_chat) as llm:
        models = make_models("openai:scripted", llm.base_url)
        lines = ["what would you try?", "try turbo", "research it", "try it", "y", "sudo it", "/exit"]
        out, asked, path = _chat(tmp_path, sglang_0523, lines, models.planner, models.researcher)
    assert (
        asked.count(APPROVE) == 1 and "approval needed: trial: set --cuda-graph-max-bs-decode to 128" in out
    )
    assert "dry run: would trial --cuda-graph-max-bs-decode 128" in out
    tx = load_transcript(path)
    assert [e["data"]["check"] for e in tx.events_of("refusal")] == ["catalog"]
    assert "--turbo-mode-xyz is not a flag of sglang" in tx.events_of("refusal")[0]["data"]["why"]
    returned = " ".join(
        str(m.get("content")) for r in llm.requests for m in r["messages"] if m["role"] == "tool"
    )
    assert "no such file in the source tree" in returned and "Unknown tool name: 'shell'" in returned
    assert "extra_forbidden" in returned
    assert tx.events_of("verdict")[0]["data"]["decided_by"] == "code"
    assert out.count("optagent> done: ") == 5  # every line answered; no error ended the chat


def test_status_names_an_earlier_kept_change_that_is_still_deployed() -> None:
    """After a run (or a resumed chat) kept a change, `/status` said `deployed: baseline`."""
    from agent.chat.actions import status_lines
    from agent.trial.record import Baseline, TrialChange, TrialRecord
    from agent.trial.runner import TrialRunner
    from tools.config import BenchConfig

    unit = "[Service]\nExecStart=/usr/bin/python -m sglang.launch_server --model-path /m --tp-size 4\n"
    kept = TrialRecord(
        number=1, changes=[TrialChange(flag="--disable-cuda-graph", action="unset")], decision="kept"
    )
    undone = TrialRecord(number=2, changes=[TrialChange(flag="--tp-size", value="2")], decision="kept")
    runner = TrialRunner(deployment=None, endpoint="http://127.0.0.1:9", bench=BenchConfig(), objective=None,
                         baseline=Baseline(reps=[], probe=None, text=unit))  # fmt: skip
    runner.trials = [kept, undone]

    class Deps:
        verdicts: dict = {}
        baseline_levels = {1: 100.0}

    Deps.runner = runner
    lines = asyncio.run(status_lines(Deps()))
    deployed = next(line for line in lines if line.startswith("deployed:"))
    assert deployed.startswith("deployed: the configuration at start, which holds the kept trial 1")
    assert "trial 2" not in deployed and "baseline" not in deployed


def test_a_failed_step_does_not_end_the_chat(tmp_path: Path, sglang_0523) -> None:
    """A model that only calls a tool that does not exist exhausts its retries: that step fails,
    the chat says so and reads the next line (it used to end the chat with a traceback)."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart

    def stuck(messages: list, info: object) -> ModelResponse:
        last = messages[-1].parts[-1]
        if getattr(last, "content", "") == "anything new?":
            return ModelResponse(parts=[TextPart("all quiet")])
        return ModelResponse(parts=[ToolCallPart("nope", {})])

    lines = ["do something", "anything new?", "/exit"]
    out, asked, path = _chat(tmp_path, sglang_0523, lines, FunctionModel(stuck))
    assert "that step failed: UnexpectedModelBehavior" in out and "optagent> all quiet" in out
    assert asked.count("you> ") == 3


def test_a_researcher_that_never_answers_validly_is_a_tool_result(tmp_path: Path, sglang_0523) -> None:
    """A research subagent out of output retries (its verdict never validates) is reported to the
    planner as research_flag's result; the planner's run goes on (it used to fail the whole run)."""
    from pydantic_ai.messages import ModelResponse, ToolCallPart

    def invalid(messages: list, info) -> ModelResponse:  # noqa: ANN001
        bad = {"flag": "--enable-torch-compile", "verdict": "great", "summary": "trust me"}
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, bad)])

    lines = ["research --enable-torch-compile", "status", "/exit"]
    out, _, path = _chat(tmp_path, sglang_0523, lines, researcher_model=FunctionModel(invalid))
    assert out.count("research of --enable-torch-compile failed: UnexpectedModelBehavior") == 1, out
    assert "optagent> the research reached no verdict (why is above); the flag stays unresearched" in out
    assert "dry run: nothing is deployed by this session" in out
    assert load_transcript(path).events_of("verdict") == []
