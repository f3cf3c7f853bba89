"""`optagent chat` says what is deployed the same way however it is asked (issue 28 item 4): `status`
and `/status` print the same lines, and after `--resume` of a session that kept a change neither
they nor an undo call the configuration at start "the baseline" (the kept flag is in it).

The real planner with the builtin chat policy and a real trial runner restored as `--resume`
restores it; nothing is deployed (the undo finds nothing of this chat to undo) and the health
check goes to a closed loopback port."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from pydantic_ai.models.function import FunctionModel
from rich.console import Console

from agent.chat.actions import previous_best
from agent.chat.policy import chat_policy
from agent.chat.session import ChatSession, target_text
from agent.context import DeploymentContext
from agent.policy.builtin.policy import researcher_policy
from agent.policy.planner import PlannerDeps, build_planner
from agent.policy.researcher import build_researcher
from agent.transcripts.transcript import Transcript
from agent.trial.record import Baseline, TrialChange, TrialRecord
from agent.trial.runner import TrialRunner
from agent.ui import RunUI
from tests.fixtures.sim import free_port
from tools.bench.objective import Goal, read_goal
from tools.config import BenchConfig

# What a run that kept `unset --disable-cuda-graph` left deployed: the unit a resumed chat starts from.
UNIT = "[Service]\nExecStart=/usr/bin/python -m sglang.launch_server --model-path /m --tp-size 4\n"
EARLIER = TrialRecord(
    number=1, changes=[TrialChange(flag="--disable-cuda-graph", action="unset")], decision="kept", restarts=2
)


def _resumed_runner() -> TrialRunner:
    runner = TrialRunner(deployment=None, endpoint=f"http://127.0.0.1:{free_port()}", bench=BenchConfig(),
                         objective=None, baseline=Baseline(reps=[], probe=None, text=UNIT), max_restarts=8)  # fmt: skip
    runner.trials, runner.restarts = [EARLIER], 2  # as `restore_state` leaves them
    return runner


def _chat(tmp_path: Path, lines: list[str]) -> str:
    feed, console = iter(lines), Console(width=200, record=True)

    async def ask(prompt: str) -> str | None:  # echoes the line, as the chat does when stdin is piped
        line = next(feed, None)
        console.print(f"{prompt}{line}", markup=False)
        return line

    t = Transcript.create(tmp_path, kind="chat", goal="improve throughput", model="builtin", target="sim")
    deps = PlannerDeps(
        goal=read_goal("improve throughput"), ctx=DeploymentContext(), candidates=[],
        ui=RunUI(console=console, transcript=t),
        researcher=build_researcher(FunctionModel(researcher_policy)), runner=_resumed_runner(),
    )  # fmt: skip
    session = ChatSession(build_planner(FunctionModel(chat_policy)), deps, t, console, ask)
    asyncio.run(session.loop())
    t.close({"status": "test"})
    return console.export_text()


def test_status_with_or_without_a_slash_prints_the_same_lines(tmp_path: Path) -> None:
    out = _chat(tmp_path, ["status", "/status", "Status?", "/exit"])
    blocks = [b.strip() for b in re.split(r"^optagent chat.*$|^you> .*$", out, flags=re.M) if b.strip()]
    assert len(blocks) == 3 and blocks[0] == blocks[1] == blocks[2], out
    assert "deployed flags: --model-path /m --tp-size 4" in blocks[0]
    assert "trials: 1, restarts: 2 of 8, budget: available" in blocks[0]
    assert "{" not in out and "optagent>" not in out  # no JSON, no planner reply


def test_after_a_kept_run_nothing_calls_the_start_the_baseline(tmp_path: Path) -> None:
    out = _chat(tmp_path, ["/status", "undo", "/rollback", "/exit"])
    holds = "the configuration at start, which holds the kept trial 1 [unset --disable-cuda-graph]: kept"
    assert f"deployed: {holds}" in out
    assert f"optagent> nothing kept in this chat to undo; deployed: {holds}" in out, out
    assert f"\nnothing kept in this chat to undo; deployed: {holds}" in out  # /rollback, not asked first
    assert "approval needed" not in out and "you> /exit" in out
    assert not [line for line in out.splitlines() if "deployed" in line and "baseline" in line], out


def test_undo_never_goes_back_to_an_earlier_sessions_kept_trial() -> None:
    """A change kept in this chat on top of a resumed run's: undoing it goes back to the start (which
    holds the run's change), not to "trial 1" (the same unit, announced as another state)."""
    runner = _resumed_runner()
    mine = TrialRecord(number=2, changes=[TrialChange(flag="--enable-mixed-chunk")], decision="kept")
    runner.trials.append(mine)
    runner.best = mine
    assert previous_best(runner) is None
    assert target_text(runner, "undo_last_kept", {}) == UNIT


def test_undoing_this_chats_change_leaves_the_earlier_one_deployed_and_recorded(
    tmp_path: Path, sim_host
) -> None:
    """A real undo on the simulated host: a run kept `--enable-mixed-chunk`, the resumed chat kept
    `--cuda-graph-max-bs-decode 64` on top and undoes it. The host is back on the start unit (the
    run's flag still in it), the reply says so, and the transcript's review keeps the run's flag
    (it said `now: baseline`, and `transcripts list` showed nothing kept)."""
    from agent.chat.actions import undo_last_kept
    from agent.transcripts.load import load_transcript
    from agent.transcripts.review import build_review
    from sim import host
    from tools.deploy.deployment import Deployment
    from tools.deploy.units.file import UnitFile

    cfg = sim_host("seed")
    sim_dir = Path(cfg.target.remote_unit).parent
    start = UnitFile.load(Path(cfg.target.local_unit)).set_flag("--enable-mixed-chunk").render()
    for unit in (Path(cfg.target.remote_unit), Path(cfg.target.local_unit)):
        unit.write_text(start)
    host.ensure_up(sim_dir)
    run_kept = TrialRecord(number=1, changes=[TrialChange(flag="--enable-mixed-chunk")], decision="kept")
    mine = TrialRecord(number=2, changes=[TrialChange(flag="--cuda-graph-max-bs-decode", value="64")],
                       decision="kept", on_top_of=[])  # fmt: skip
    t = Transcript.create(tmp_path, kind="chat", goal="improve throughput", model="builtin", target="sim")
    for record in (run_kept, mine):
        t.event("trial", record.model_dump(mode="json"))

    async def scenario() -> str:
        async with Deployment(cfg.target) as d:
            await d.deploy(
                UnitFile.parse(start).set_flag("--cuda-graph-max-bs-decode", "64").render(), reason="t"
            )
            await d.commit()  # trial 2 kept: deployed and known-good
            runner = TrialRunner(deployment=d, endpoint=cfg.target.endpoint, bench=BenchConfig(), objective=None,
                                 baseline=Baseline(reps=[], probe=None, text=start))  # fmt: skip
            runner.trials, runner.best = [run_kept, mine], mine
            deps = PlannerDeps(goal=Goal(), ctx=DeploymentContext(), candidates=[], runner=runner,
                               ui=RunUI(console=Console(), transcript=t), researcher=None)  # fmt: skip
            return await undo_last_kept(deps)

    said = asyncio.run(scenario())
    t.close({"status": "test"})
    assert said == (
        "rolled back trial 2 (--cuda-graph-max-bs-decode 64); deployed now: the configuration at start, "
        "which holds the kept trial 1 [--enable-mixed-chunk]: kept"
    )
    assert Path(cfg.target.remote_unit).read_text() == start
    loaded = load_transcript(t.path)
    assert [e["data"]["now"] for e in loaded.events_of("deploy") if e["data"].get("action") == "undo"] == [
        "trial 1"
    ]
    assert build_review(loaded).kept == ["--enable-mixed-chunk"]


def test_the_other_bare_command_names_are_their_commands(tmp_path: Path) -> None:
    """`todo` and `exit` without the slash: the todo list and the end of the chat, not a planner
    turn (the builtin policy would have answered `exit` with its help)."""
    out = _chat(tmp_path, ["todo", "exit", "never read"])
    assert "you> todo\n(the todo list is empty)\nyou> exit\n" in out, out
    assert "never read" not in out and "I understand" not in out
