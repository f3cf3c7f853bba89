"""A chat that knows its state (issue 51 item 7): after another session changed three flags, "what
is deployed now?" names the flags the host runs and what changed since that session started (it
said "the configuration at start"); "try --FLAG" for a flag already deployed is answered at once,
with no baseline, no approval question and no restart (it cost an 80 s baseline first); "what would
you try first and why?" gives one first pick with its reason in the run's order, then a short list
(it printed 17 lines and no pick).

The real `optagent` CLI in subprocesses against a simulated seed host on loopback, the builtin
policy, SGLang 0.5.23's source; and, in process, the approval gate's answer to an LLM that asks
for a trial of what is already deployed."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.fixtures.sim import free_port
from tools.bench.objective import Goal

CLI = "import sys; from agent.cli.main import app; app(sys.argv[1:])"
THREE = [
    "--set",
    "enable-mixed-chunk",
    "--set",
    "num-continuous-decode-steps=4",
    "--set",
    "schedule-conservativeness=0.5",
]


def _toml(name: str, data: dict) -> str:
    return "\n".join([f"[{name}]"] + [f"{k} = {json.dumps(v)}" for k, v in data.items() if v is not None])


def _optagent(d: Path, *args: str, stdin: str = "", timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI, *args], input=stdin, capture_output=True, text=True, cwd=d,
        timeout=timeout, env={**__import__("os").environ, "COLUMNS": "400"},
    )  # fmt: skip


@pytest.fixture
def project(tmp_path: Path, sglang_0523):
    """A simulated seed host (time scale 0.03) and an optagent.toml for it, reading 0.5.23's source."""
    from sim import host

    cfg = host.create(tmp_path / "sim", scenario="seed", port=free_port(), time_scale=0.03)
    host.ensure_up(tmp_path / "sim")
    tables = [  # the default benchmark levels (1, 8, 64): nothing here measures them
        _toml("target", cfg.target.model_dump(mode="json")),
        _toml("agent", {"transcripts_dir": str(tmp_path / "transcripts")}),
        _toml("research", {"source_dir": str(sglang_0523.root)}),
    ]
    (tmp_path / "optagent.toml").write_text("simulated = true\n" + "\n\n".join(tables) + "\n")
    yield tmp_path
    host.down(tmp_path / "sim")


def _sessions(d: Path) -> list[dict]:
    out = _optagent(d, "transcripts", "list", "--dir", str(d / "transcripts"), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _reply(log: str, question: str) -> str:
    """What the chat printed for one user line, up to the next prompt."""
    start = log.index(f"you> {question}") + len(f"you> {question}")
    return log[start : log.index("you> ", start)]


@pytest.mark.slow(seconds=90)
def test_after_another_session_changed_three_flags_chat_knows_what_is_deployed(project: Path) -> None:
    from agent.transcripts.load import load_transcript

    d = project
    unit = d / "sim" / "sglang.service"
    out = _optagent(d, "chat", "--config", "optagent.toml", stdin="/exit\n")  # the session before
    assert out.returncode == 0, out.stderr[-2000:]
    [before] = _sessions(d)
    out = _optagent(d, "deploy", "--config", "optagent.toml", *THREE, "--yes")  # three flags change
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    deployed = unit.read_text()
    assert "--enable-mixed-chunk" in deployed and "--num-continuous-decode-steps 4" in deployed

    script = (
        "what is deployed now?\ntry --enable-mixed-chunk\nwhat would you try first and why?\n"
        "list the candidates\n/exit\n"
    )
    out = _optagent(d, "chat", "--config", "optagent.toml", stdin=script)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log = out.stdout

    now = _reply(log, "what is deployed now?")
    assert f"deployed now (the host's unit file {unit}): " in now, now
    assert "--enable-mixed-chunk --num-continuous-decode-steps 4 --schedule-conservativeness 0.5" in now
    assert "since this chat started: no change" in now
    assert re.search(
        rf"since the chat {before['id']} started at [\d-]+ [\d:]+: set --enable-mixed-chunk; "
        r"set --num-continuous-decode-steps 4; set --schedule-conservativeness 0\.5\n",
        now,
    ), now
    assert "this is the known-good configuration on record, recorded " in now
    assert "the configuration at start" not in now

    # already deployed: answered at once, before any research, baseline, question or restart
    tried = _reply(log, "try --enable-mixed-chunk")
    assert (
        f"--enable-mixed-chunk: already deployed (the host's unit file {unit}); it came after the chat"
        in tried
    )
    assert "(set --enable-mixed-chunk)" in tried and "no baseline, no restart" in tried
    for never in ("measuring the baseline", "approval needed", "--enable-mixed-chunk: applies", "trial 1"):
        assert never not in tried, tried
    assert unit.read_text() == deployed  # nothing restarted or rewritten

    # one first pick, its reason from research and the run's order, then at most three next ones
    pick = _reply(log, "what would you try first and why?")
    answer = pick[pick.index("optagent> ") :].strip()
    lines = answer.splitlines()
    assert lines[0] == "optagent> First: --cuda-graph-max-bs-decode 64.", answer
    # its certainty is its rule's record on the taught labels (tools/research/verdict/calibration.toml)
    why = re.match(
        r"Why: research says 'applies' \(code, certainty (0\.\d\d)\), its evidence above\.", lines[1]
    )
    assert why and float(why.group(1)) > 0.6, lines[1]
    sure = why.group(1)
    assert f"{sure} x +6.0% / 1 trial = +{float(sure) * 6.0:.1f}%, the order a run uses." in lines[1]
    assert lines[2].startswith("Next: ") and lines[2].count(" (") <= 3, answer
    assert "--enable-mixed-chunk" not in answer  # already deployed: not a candidate
    assert lines[-1] == "'try --cuda-graph-max-bs-decode 64' runs it; 'list the candidates' shows every one."
    assert len(lines) <= 5, answer
    assert f"--cuda-graph-max-bs-decode: applies (code, certainty {sure}" in pick  # researched for it

    # the candidates a run would have: what the server already resolves to is already set
    listed = _reply(log, "list the candidates")
    resolved = "the running server already resolves --chunked-prefill-size to 8192"
    assert f"--chunked-prefill-size 8192 (low) — already-set: {resolved}" in listed, listed

    [chat] = [s for s in _sessions(d) if s["id"] != before["id"]]
    loaded = load_transcript(Path(chat["path"]))
    assert not loaded.events_of("baseline") and not loaded.events_of("trial")
    assert not loaded.events_of("approval")
    # the try turn took no time to speak of: from the user's line to the reply
    stamps = [
        datetime.fromisoformat(m["ts"])
        for m in loaded.messages
        if m.get("agent") == "planner" and m.get("ts")
    ]
    turn = [m for m in loaded.messages if m.get("agent") == "planner"]
    first = next(i for i, m in enumerate(turn) if "try --enable-mixed-chunk" in json.dumps(m.get("parts")))
    reply = next(
        i for i in range(first + 1, len(turn)) if "already deployed" in json.dumps(turn[i].get("parts"))
    )
    assert (stamps[reply] - stamps[first]).total_seconds() < 10


def test_an_llm_asking_to_trial_what_is_deployed_gets_the_answer_at_once(tmp_path: Path) -> None:
    """A model (scripted here) that calls run_trial for a switch the deployed unit already has: no
    approval question, no baseline (the trial runner used to find it only after measuring one), no
    trial record; the tool result says it is already deployed."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel
    from rich.console import Console

    from agent.chat.session import ChatSession
    from agent.context import DeploymentContext
    from agent.policy.planner import PlannerDeps, build_planner
    from agent.transcripts.transcript import Transcript
    from agent.trial.record import Baseline
    from agent.trial.runner import TrialRunner
    from agent.ui import RunUI
    from prompts import render
    from tools.config import BenchConfig

    unit = (
        "[Service]\nExecStart=/usr/bin/python -m sglang.launch_server --model-path /m --tp-size 4 "
        "--enable-mixed-chunk\n"
    )
    # no probe yet: a baseline would be measured against this closed port first, and fail
    runner = TrialRunner(deployment=None, endpoint=f"http://127.0.0.1:{free_port()}", bench=BenchConfig(),
                         objective=None, baseline=Baseline(reps=[], probe=None, text=unit), max_restarts=8)  # fmt: skip
    seen: list[dict] = []
    prompts: list[str] = []

    def model(messages, info):  # type: ignore[no-untyped-def]
        from agent.policy.builtin.messages import tool_returns

        prompts.append(info.instructions or "")
        returns = tool_returns(messages)
        if not returns:
            change = {"flag": "--enable-mixed-chunk", "action": "set"}
            return ModelResponse(parts=[ToolCallPart("run_trial", {"changes": [change], "reason": "asked"})])
        seen.append(returns[-1][1])
        return ModelResponse(parts=[TextPart("ok")])

    asked: list[str] = []

    async def ask(prompt: str) -> str | None:
        asked.append(prompt)
        return "y"

    console = Console(width=200, record=True)
    t = Transcript.create(tmp_path, kind="chat", goal="improve throughput", model="scripted", target="sim")
    deps = PlannerDeps(goal=Goal(), ctx=DeploymentContext(), candidates=[], ui=RunUI(console=console, transcript=t),
                       researcher=None, runner=runner)  # fmt: skip
    ctx = {"sglang_version": "0.5.23", "unit_flags": {}, "model": {}, "hardware": None, "catalog_size": 0,
           "missing": {}}  # fmt: skip
    instructions = render("planner.md.j2", goal="g", allow_lossy=False, lossy={}, max_trials=3, dry_run=False,
                          context=ctx, objective="throughput", baseline={}, chat=True)  # fmt: skip
    session = ChatSession(
        build_planner(FunctionModel(model)), deps, t, console, ask, instructions=instructions
    )
    started = time.monotonic()
    assert asyncio.run(session.turn("try --enable-mixed-chunk")) == "ok"
    t.close({"status": "test"})
    assert time.monotonic() - started < 5
    assert seen == [
        {
            "already_deployed": ["--enable-mixed-chunk"],
            "restarts": 0,
            "note": "--enable-mixed-chunk is already deployed: the configuration would not change; no trial, no restart",
        }
    ]
    assert asked == [] and runner.trials == [] and runner.restarts == 0 and runner.baseline.probe is None
    # the model is given the planner's prompt with its chat section (a chat sent none)
    assert prompts and all("## In a chat" in p and "call `deployed_now` with it" in p for p in prompts)
    assert "measuring the baseline" not in console.export_text()


def _lever(flag: str, priority: str) -> dict:
    return {"flag": flag, "value": None, "action": "set", "status": "candidate", "priority": priority,
            "lossy": False, "helps": f"{flag} helps"}  # fmt: skip


def _verdict(flag: str, verdict: str, sure: float) -> dict:
    return {
        "flag": flag,
        "verdict": verdict,
        "certainty": sure,
        "decided_by": "code",
        "summary": f"{flag} {verdict}",
    }


def test_the_first_pick_researches_only_what_could_come_first_and_matches_the_full_order() -> None:
    """Research goes in batches down the most each candidate could be worth, and stops when nothing
    unresearched could beat the best so far: the pick is the one a run researching everything puts
    first (`trial_queue`), for fewer researches."""
    from agent.policy.builtin.pick import could_come_first, first_pick_text
    from agent.policy.builtin.policy import trial_queue

    cands = [_lever("--a", "high"), _lever("--b", "high"), _lever("--c", "high"), _lever("--d", "high"),
             _lever("--e", "medium"), _lever("--f", "low")]  # fmt: skip
    research = {
        "--a": _verdict("--a", "no-op", 0.95), "--b": _verdict("--b", "dead", 0.95),
        "--c": _verdict("--c", "applies", 0.55), "--d": _verdict("--d", "applies", 0.9),
        "--e": _verdict("--e", "applies", 0.9), "--f": _verdict("--f", "applies", 0.9),
    }  # fmt: skip
    known: dict[str, dict] = {}
    asked = []
    while batch := could_come_first(cands, known, {}, set()):
        asked.append(batch)
        known.update({f: research[f] for f in batch})
    # the high ones first, three at a time; --e (at most +4%) could still beat --c's +3.3%, so it
    # goes with --d; --f (at most +2%) could not beat --d's +5.4% and is never researched
    assert asked == [["--a", "--b", "--c"], ["--d", "--e"]]
    everything = trial_queue(cands, research, {})
    assert everything[0][0]["flag"] == "--d" == trial_queue(cands, known, {})[0][0]["flag"]
    text = first_pick_text(cands, known, {})
    assert text.splitlines()[0] == "First: --d."
    assert "Why: research says 'applies' (code, certainty 0.90): --d applies." in text
    assert "Next: --e (+3.6%); --c (+3.3%); --f (not researched yet, at most +2.0%)." in text
    assert "Ruled out by research: --a, --b." in text
    # a research that gave no verdict is said: it could have come first
    text = first_pick_text(cands, {k: v for k, v in known.items() if k != "--d"}, {}, failed={"--d"})
    assert "Research of --d failed (why is above): 'research --d' again before trusting this order." in text


def test_what_a_run_kept_is_named_after_it(tmp_path: Path) -> None:
    """The session before the chat was a run that kept a bundle of three flags: "what is deployed
    now?" names the run, the three flags it changed, and the trial that kept them."""
    from rich.console import Console

    from agent.chat.deployed import deployed_lines, deployed_now
    from agent.context import DeploymentContext
    from agent.policy.planner import PlannerDeps
    from agent.transcripts.transcript import Transcript
    from agent.trial.record import Baseline, TrialChange, TrialRecord
    from agent.trial.runner import TrialRunner
    from agent.ui import RunUI
    from tools.config import BenchConfig

    three = [TrialChange(flag="--enable-mixed-chunk"), TrialChange(flag="--cuda-graph-max-bs-decode", value="64"),
             TrialChange(flag="--num-continuous-decode-steps", value="4")]  # fmt: skip
    run = Transcript.create(tmp_path, kind="run", goal="improve throughput", model="builtin", target="sim")
    run.event("context", {"unit_flags": {"--model-path": "/m", "--cuda-graph-max-bs-decode": "32"}})
    kept = TrialRecord(number=2, kind="bundle", changes=three, decision="kept")
    run.event("trial", kept.model_dump(mode="json"))
    run.close({"status": "done"})
    now = (
        "[Service]\nExecStart=/usr/bin/python -m sglang.launch_server --model-path /m "
        "--cuda-graph-max-bs-decode 64 --enable-mixed-chunk --num-continuous-decode-steps 4\n"
    )
    runner = TrialRunner(deployment=None, endpoint="http://127.0.0.1:9", bench=BenchConfig(), objective=None,
                         baseline=Baseline(reps=[], probe=None, text=now))  # fmt: skip
    chat = Transcript.create(tmp_path, kind="chat", goal="improve throughput", model="builtin", target="sim")
    deps = PlannerDeps(goal=Goal(), ctx=DeploymentContext(), candidates=[], researcher=None, runner=runner,
                       ui=RunUI(console=Console(), transcript=chat))  # fmt: skip
    state = asyncio.run(
        deployed_now(deps, [{"flag": "--enable-mixed-chunk"}, {"flag": "--tp-size", "value": "2"}])
    )
    chat.close({"status": "test"})
    lines = deployed_lines(state)
    assert lines[0] == (
        "deployed now (this chat's record of what it deployed): --model-path /m --cuda-graph-max-bs-decode 64 "
        "--enable-mixed-chunk --num-continuous-decode-steps 4"
    )
    assert lines[1] == "since this chat started: no change"
    assert lines[2].startswith(f"since the run {run.id} started at ")
    assert lines[2].endswith(
        ": --cuda-graph-max-bs-decode 32 -> 64; set --enable-mixed-chunk; set --num-continuous-decode-steps 4 "
        f"(it kept {kept.headline()})"
    )
    assert state["already_deployed"] == ["--enable-mixed-chunk"]  # not --tp-size 2
