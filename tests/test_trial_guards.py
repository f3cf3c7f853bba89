"""Trial runner guards, mostly at unit level against a small fake of the `Deployment` API."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import pytest

from agent.trial.record import Baseline, TrialChange
from agent.trial.runner import TrialRunner
from tools.bench.objective import Objective
from tools.config import BenchConfig
from tools.deploy.deployment import DeployOutcome

UNIT = """[Service]
ExecStart=/opt/venv/bin/python -m sglang.launch_server --model-path /models/m --port 30000
"""


@dataclass
class FakeDeployment:
    """Records what the runner asked for; `deploy` takes `deploy_s` seconds, then fails to start."""

    deploy_s: float = 0.0
    events: list[str] = field(default_factory=list)

    async def __aenter__(self) -> FakeDeployment:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.events.append("exit")  # the real one releases the lock and closes the connection

    async def deploy(self, text: str, *, reason: str) -> DeployOutcome:
        self.events.append("deploy")
        try:
            await asyncio.sleep(self.deploy_s)
        except asyncio.CancelledError:
            self.events.append("deploy cancelled")
            raise
        self.events.append("deploy done")
        return DeployOutcome(ok=False, error="did not start", rolled_back=True)

    async def rollback(self) -> DeployOutcome:
        await asyncio.sleep(0.01)
        self.events.append("rollback")
        return DeployOutcome(ok=True)

    async def commit(self) -> None:
        self.events.append("commit")

    async def recover(self) -> str | None:
        self.events.append("recover")
        return None

    async def keepalive(self) -> bool:
        self.events.append("keepalive")
        return True


SMALL = BenchConfig(concurrency=[1, 4], input_len=64, output_len=16, warmup=0, reps=2)


@pytest.fixture
def known_good(sim_server):  # type: ignore[no-untyped-def]
    """A small simulated server: the known-good launch the runner measures before each candidate."""
    return sim_server("seed", time_scale=0.05)


def _runner(deployment: FakeDeployment, server=None, **kw: object) -> TrialRunner:  # type: ignore[no-untyped-def]
    """A runner on `server` (None: nothing listens; for trials that never measure)."""
    return TrialRunner(
        deployment=deployment,
        endpoint=server.endpoint if server else "http://127.0.0.1:9",
        bench=SMALL,
        objective=Objective(),
        baseline=Baseline(reps=[], probe=None, text=UNIT),
        **kw,
    )


def test_cancelled_trial_rolls_back_before_the_deployment_is_exited(known_good):
    fake = FakeDeployment(deploy_s=0.3)
    runner = _runner(fake, known_good)

    async def session() -> None:
        async with fake:
            await runner.run([TrialChange(flag="--cuda-graph-max-bs", value="64")], reason="test")

    async def main() -> None:
        task = asyncio.create_task(session())
        while "deploy" not in fake.events:  # known-good is measured first
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # inside deploy()
        task.cancel()  # what asyncio.run does on Ctrl-C
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.4)  # anything still running in the background would show up now

    asyncio.run(main())
    assert fake.events == ["deploy", "deploy cancelled", "rollback", "exit"]
    assert runner.trials[0].decision == "rolled_back"
    assert "CancelledError" in runner.trials[0].why


@dataclass
class HealthyFake(FakeDeployment):
    """`deploy` starts fine (the server is left as it is); `on_deploy` runs while the trial is in flight."""

    on_deploy: object = None

    async def deploy(self, text: str, *, reason: str) -> DeployOutcome:
        self.events.append("deploy")
        if callable(self.on_deploy):
            self.on_deploy()
        return DeployOutcome(ok=True)


KV_FP8 = TrialChange(flag="--kv-cache-dtype", value="fp8_e4m3")


def test_known_lossy_change_is_refused_without_a_restart():
    fake = HealthyFake()
    runner = _runner(fake, lossy={"--kv-cache-dtype": "playbook: greedy outputs drift"})
    record = asyncio.run(runner.run([KV_FP8], reason="test"))
    assert fake.events == []  # nothing deployed, nothing restarted
    assert (record.decision, record.deployed, record.restarts, runner.restarts) == ("skipped", False, 0, 0)
    assert "known lossy" in record.why and "--allow-lossy" in record.why


def test_known_lossy_change_is_deployed_when_allowed(known_good):
    fake = FakeDeployment()  # fails to start: enough to see that it was deployed
    runner = _runner(fake, known_good, lossy={"--kv-cache-dtype": "playbook"}, allow_lossy=True)
    record = asyncio.run(runner.run([KV_FP8], reason="test"))
    assert fake.events == ["deploy", "deploy done"]
    assert record.decision == "rolled_back" and record.restarts == 2


def test_change_marked_lossy_mid_trial_is_not_kept_even_with_identical_outputs(sim_server):
    from tools.bench.probe import run_probe

    server = sim_server("seed", time_scale=0.05)
    fake = HealthyFake()
    runner = _runner(fake, server)
    runner.baseline.probe = asyncio.run(run_probe(server.endpoint))
    # research finishes while the trial runs and says the flag is lossy
    fake.on_deploy = lambda: runner.lossy.setdefault("--kv-cache-dtype", "research: FP8 KV cache")
    record = asyncio.run(runner.run([KV_FP8], reason="test"))
    assert record.probe == "identical"  # the probe alone would have let it through
    assert record.decision == "rolled_back" and "known lossy" in record.why
    assert fake.events == ["deploy", "keepalive", "rollback"] and not record.levels  # no commit, no benchmark


def _history(cands: list[dict], verdicts: dict[str, dict]) -> list:
    """The planner's history after list_candidates, the first todo_write and the research."""
    from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart

    calls = [ToolCallPart("todo_write", {"items": []}, tool_call_id="todo")]
    calls += [ToolCallPart("research_flag", {"flag": f}, tool_call_id=f) for f in verdicts]
    returns = [ToolReturnPart("todo_write", "ok", tool_call_id="todo")]
    returns += [ToolReturnPart("research_flag", v, tool_call_id=f) for f, v in verdicts.items()]
    return [
        ModelRequest(parts=[UserPromptPart("go")]),
        ModelResponse(parts=[ToolCallPart("list_candidates", {}, tool_call_id="c")]),
        ModelRequest(parts=[ToolReturnPart("list_candidates", cands, tool_call_id="c")]),
        ModelResponse(parts=calls),
        ModelRequest(parts=returns),
    ]


def _cand(flag: str, value: str, *, lossy: bool, allowed: bool) -> dict:
    return {
        "flag": flag,
        "value": value,
        "action": "set",
        "status": "candidate",
        "note": "",
        "priority": "high",
        "lossy": lossy,
        "lossy_allowed": allowed,
        "what": "",
        "helps": "helps",
        "risk": "",
    }


def _verdict(flag: str, *, lossy: bool = False) -> dict:
    return {"flag": flag, "verdict": "applies", "summary": "read here", "lossy": lossy}


def _next_calls(cands: list[dict], verdicts: dict[str, dict]) -> dict[str, dict]:
    from agent.policy.builtin.policy import planner_policy

    response = planner_policy(_history(cands, verdicts), None)
    return {p.tool_name: p.args_as_dict() for p in response.parts if hasattr(p, "tool_name")}


def test_builtin_planner_skips_lossy_levers_without_allow_lossy():
    verdicts = {"--kv-cache-dtype": _verdict("--kv-cache-dtype"), "--x": _verdict("--x", lossy=True)}
    cands = [
        _cand("--kv-cache-dtype", "fp8_e4m3", lossy=True, allowed=False),  # lossy by the playbook
        _cand("--x", "1", lossy=False, allowed=False),  # lossy by the research
    ]
    calls = _next_calls(cands, verdicts)
    assert "run_trial" not in calls
    todo = {i["id"]: i for i in calls["todo_write"]["items"]}
    for flag in verdicts:
        assert todo[flag]["status"] == "cancelled" and "lossy" in todo[flag]["content"]


def test_builtin_planner_trials_lossy_levers_when_allowed():
    verdicts = {"--kv-cache-dtype": _verdict("--kv-cache-dtype")}
    calls = _next_calls([_cand("--kv-cache-dtype", "fp8_e4m3", lossy=True, allowed=True)], verdicts)
    assert calls["run_trial"]["changes"][0]["flag"] == "--kv-cache-dtype"


def test_session_marks_playbook_lossy_levers_for_the_runner():
    from agent.policy.playbook import PLAYBOOK_PATH, Candidate, load_playbook
    from agent.trial.record import lossy_flags

    levers = {lv.flag: lv for lv in load_playbook(PLAYBOOK_PATH)}
    cands = [
        Candidate(
            flag=f,
            value=levers[f].value,
            action="set",
            lever=levers[f],
            needs=[],
            conflicts=[],
            status="candidate",
        )
        for f in ("--kv-cache-dtype", "--enable-torch-compile")
    ]
    assert list(lossy_flags(cands)) == ["--kv-cache-dtype"]


@dataclass
class FailingFake(FakeDeployment):
    """`deploy` fails with `error` and `log_tail`, as `tools.deploy.deployment.Deployment` reports it."""

    error: str = ""
    log_tail: str = ""

    async def deploy(self, text: str, *, reason: str) -> DeployOutcome:
        self.events.append("deploy")
        return DeployOutcome(ok=False, error=self.error, log_tail=self.log_tail, rolled_back=True)


def test_port_in_use_is_an_environment_failure_and_stops_trials(known_good):
    import pytest

    from agent.trial.record import BudgetExhausted

    fake = FailingFake(
        error="the server process exited",
        log_tail="ERROR: [Errno 98] error while attempting to bind on address: address already in use",
    )
    runner = _runner(fake, known_good)
    record = asyncio.run(runner.run([TrialChange(flag="--enable-mixed-chunk")], reason="test"))
    assert record.environment == "the server's port is already in use"
    assert record.why.startswith("environment failure, not the flag")
    assert runner.halted and "port" in runner.halted
    with pytest.raises(BudgetExhausted, match="trials stopped"):
        asyncio.run(runner.run([TrialChange(flag="--disable-radix-cache")], reason="test"))
    assert fake.events == ["deploy"]  # the second candidate never reached the host


def test_a_flag_that_fails_to_start_is_the_flags_failure(known_good):
    fake = FailingFake(error="the server process exited", log_tail="ValueError: fa3 requires sm80-sm90")
    runner = _runner(fake, known_good)
    record = asyncio.run(runner.run([TrialChange(flag="--attention-backend", value="fa3")], reason="t"))
    assert record.environment is None and record.why.startswith("failed to start")
    assert runner.halted is None and runner.budget_left() is None


def test_failed_rollback_stops_trials_and_restores_known_good_first(sim_server):
    server = sim_server("seed", time_scale=0.05)  # the known-good server the restore must find healthy
    fake = FailingFake(error="did not start; ROLLBACK FAILED: restart timed out")
    runner = _runner(fake, server)
    record = asyncio.run(runner.run([TrialChange(flag="--enable-mixed-chunk")], reason="test"))
    assert fake.events == ["deploy", "recover", "rollback"]  # restore before anything else
    assert "ROLLBACK FAILED" in record.why
    assert runner.halted and "rollback failed" in runner.halted
    assert "healthy" not in runner.halted  # the restore found the server healthy


def test_a_trial_starts_when_it_fits_should_it_win():
    import time

    from agent.trial.record import TrialRecord

    runner = _runner(FakeDeployment())
    rejected = TrialRecord(number=1, changes=[TrialChange(flag="--a")], deployed=True, seconds=100.0)
    runner.trials.append(rejected)
    # the longest trial measured is what the next one may take (this runner's baseline has no timing)
    runner.deadline = time.monotonic() + 90
    assert runner.trial_estimate() == 100.0 and runner.budget_left() == "wall-time budget spent"
    runner.deadline = time.monotonic() + 110
    assert runner.budget_left() is None
    kept = TrialRecord(
        number=2, changes=[TrialChange(flag="--b")], deployed=True, decision="kept", seconds=120.0
    )
    runner.trials.append(kept)
    runner.deadline = time.monotonic() + 130
    assert runner.trial_estimate() == 120.0 and runner.budget_left() is None
    # a near miss's third launch is not what the next trial needs: it starts only if time is left
    third = TrialRecord(
        number=3, changes=[TrialChange(flag="--c")], deployed=True, seconds=300.0, third_seconds=200.0
    )
    runner.trials.append(third)
    assert runner.trial_estimate() == 120.0 and runner.budget_left() is None
    runner.deadline = time.monotonic() + 110
    assert runner.budget_left() == "wall-time budget spent"


def test_a_trial_is_budgeted_by_the_trials_on_its_own_workload():
    from agent.trial.record import TrialRecord

    runner = _runner(FakeDeployment())
    cache, compile_ = (
        [TrialChange(flag="--disable-radix-cache")],
        [TrialChange(flag="--enable-torch-compile")],
    )
    # a caching flag's trial runs on the shared-prefix mix, whose blocks take longer
    runner.trials.append(TrialRecord(number=1, changes=cache, deployed=True, seconds=300.0))
    # no trial on random prompts yet: every trial sets the figure
    assert runner.trial_estimate(compile_) == 300.0
    runner.trials.append(TrialRecord(number=2, changes=compile_, deployed=True, seconds=100.0))
    assert runner.trial_estimate(compile_) == runner.trial_estimate() == 100.0
    assert runner.trial_estimate([TrialChange(flag="--chunked-prefill-size", value="8192")]) == 300.0


def test_a_flag_that_starts_slowly_is_budgeted_with_its_longer_launches():
    import time

    from agent.trial.record import TrialRecord

    fake = FakeDeployment()
    runner = _runner(fake, slow_starts={"--enable-torch-compile": 2.0})
    runner.trials.append(
        TrialRecord(number=1, changes=[TrialChange(flag="--a")], deployed=True, seconds=100.0)
    )
    for seconds in (30.0, 20.0, 200.0):  # restarts so far; the slow one does not set the figure
        runner.note_restart(DeployOutcome(ok=True, seconds=seconds))
    compile_ = [TrialChange(flag="--enable-torch-compile")]
    # an ordinary trial: the longest so far; a slow start: two launches a median restart longer each
    assert runner.trial_estimate() == 100.0 and runner.trial_estimate(compile_) == 160.0
    runner.deadline = time.monotonic() + 130
    assert runner.budget_left(changes=[TrialChange(flag="--enable-mixed-chunk")]) is None
    why = runner.budget_left(changes=compile_)
    assert why is not None and "--enable-torch-compile takes longer" in why
    # skipped before anything is deployed; a trial that fits may still run after it
    record = asyncio.run(runner.run(compile_, reason="t"))
    assert fake.events == [] and record.decision == "skipped" and why in record.why
    assert runner.exhausted is None and runner.budget_left() is None


def test_a_trial_records_every_repetition_so_a_reviewer_can_recompute_its_interval(sim_server):
    from agent.trial.record import TrialRecord, samples_as_sweeps
    from tools.bench.objective import Objective
    from tools.bench.paired import paired_compare
    from tools.bench.probe import run_probe

    server = sim_server("seed", time_scale=0.05)
    bench = BenchConfig(concurrency=[1, 4], input_len=64, output_len=16, warmup=0, reps=2)
    runner = TrialRunner(
        deployment=HealthyFake(),  # "deploys" without touching the server: an A/A trial
        endpoint=server.endpoint,
        bench=bench,
        objective=Objective(),
        baseline=Baseline(reps=[], probe=asyncio.run(run_probe(server.endpoint)), text=UNIT),
    )
    record = asyncio.run(
        runner.run([TrialChange(flag="--num-continuous-decode-steps", value="2")], reason="A/A")
    )
    assert record.decision in ("rolled_back", "kept") and record.blocks["candidate"] >= 2
    # what the transcript stores, read back
    saved = TrialRecord.model_validate(record.model_dump(mode="json"))
    assert {k: len(v) for k, v in saved.samples.items()} == saved.blocks
    assert all(set(map(int, rep)) == {1, 4} for block in saved.samples.values() for rep in block)
    # every block on the same prompts: repetition r on seed r (a repetition beyond 2 on one of those again)
    assert all(saved.seeds[k] == [r % bench.reps for r in range(n)] for k, n in saved.blocks.items())
    blocks = {k: samples_as_sweeps(v, saved.seeds[k]) for k, v in saved.samples.items()}
    # a near miss is launched a third time: known-good again, then the candidate; every known-good
    # block of the run is the history whose spread is pooled with the declared one
    third = (blocks["after_second"], blocks["third"]) if "third" in blocks else None
    history = [blocks[k] for k in ("before", "after", "after_second") if k in blocks]
    again = paired_compare(
        blocks["before"], blocks["candidate"], blocks.get("after"), Objective(),
        launch_noise=bench.launch_noise, confirm=blocks.get("confirm"), third=third, history=history,
    )  # fmt: skip
    assert again.ratio == pytest.approx(record.comparison["ratio"], rel=1e-9)
    assert again.overall.ci_low == pytest.approx(record.comparison["overall"]["ci_low"], rel=1e-9)


def test_a_slow_start_costs_what_its_launches_add_to_a_trial_here():
    from agent.policy.order import expected_value
    from agent.trial.record import TrialRecord

    runner = _runner(FakeDeployment(), slow_starts={"--enable-torch-compile": 2.0})
    # before any restart is timed: the playbook's figure (two restarts' worth)
    assert runner.trial_cost("--enable-torch-compile") == 2.0 and runner.trial_cost("--a") == 1.0
    runner.trials.append(
        TrialRecord(number=1, changes=[TrialChange(flag="--a")], deployed=True, seconds=300.0)
    )
    runner.note_restart(DeployOutcome(ok=True, seconds=30.0))
    # blocks dominate a trial: two launches 30 s longer each add a fifth to a 300 s trial
    assert runner.trial_cost("--enable-torch-compile") == 1.2 and runner.trial_cost("--a") == 1.0
    cand = {"flag": "--enable-torch-compile", "priority": "medium", "trial_cost": 1.2}
    assert expected_value(cand, {"verdict": "applies"}) == 0.8 * 0.04 / 1.2
    # start-up dominates: at 300 s a restart, a winner's three restarts alone take 900 s (more than
    # the trial measured), and the slow start's two launches add 600 s to them
    runner.note_restart(DeployOutcome(ok=True, seconds=300.0))
    runner.note_restart(DeployOutcome(ok=True, seconds=300.0))
    assert runner.trial_estimate() == 900.0
    assert runner.trial_cost("--enable-torch-compile") == (900.0 + 2 * 300.0) / 900.0


def test_a_trial_that_runs_over_the_budget_stops_at_its_next_safe_point(sim_server):
    """The trial fits when it starts; a slow start then leaves no time for the candidate's block:
    the block is not started, the candidate is rolled back and trials stop, before the deadline."""
    import time

    from agent.trial.record import BudgetExhausted
    from tools.bench.probe import run_probe

    server = sim_server("seed", time_scale=0.05)
    fake = HealthyFake()
    runner = _runner(fake, server, deadline=time.monotonic() + 600)
    runner.baseline.probe = asyncio.run(run_probe(server.endpoint))
    # the candidate's start took what was left but a little (a slow machine, a long load): its block
    # of two repetitions and the rollback after it (three repetitions' time) no longer fit
    fake.on_deploy = lambda: setattr(runner, "deadline", time.monotonic() + 2.5 * runner.rep_estimate())
    with pytest.raises(BudgetExhausted, match="wall-time budget: the candidate block needs"):
        asyncio.run(runner.run([TrialChange(flag="--cuda-graph-max-bs", value="64")], reason="test"))
    record = runner.trials[0]
    assert fake.events == ["deploy", "keepalive", "keepalive", "rollback"]  # probe, no block, rolled back
    assert record.decision == "rolled_back" and record.why.startswith("stopped: wall-time budget")
    assert "candidate" not in record.blocks and record.blocks == {}  # no block measured on it
    assert time.monotonic() < runner.deadline  # it stopped before the budget ran out
    assert runner.exhausted and runner.budget_left() is not None  # and no further trial starts


def test_another_repetition_is_measured_only_while_it_fits(sim_server):
    import time

    from agent.trial.record import TrialRecord
    from agent.trial.steps import measure_block

    server = sim_server("seed", time_scale=0.05)
    runner = _runner(HealthyFake(), server, deadline=time.monotonic() + 600)
    reps = asyncio.run(measure_block(runner, None, "before", start=1, max_reps=1))
    one = runner.rep_estimate()
    assert one > 0 and len(reps) == 1
    # room for the block's one repetition, not for the second `more` asks for
    runner.deadline = time.monotonic() + 1.3 * one
    record = TrialRecord(number=1, changes=[], reason="test")
    reps = asyncio.run(measure_block(runner, record, "after", start=1, more=lambda reps: True, max_reps=6))
    assert len(reps) == 1
    runner.deadline = time.monotonic() + 600  # with time, `more` has its way
    assert (
        len(asyncio.run(measure_block(runner, record, "after", start=1, more=lambda reps: True, max_reps=3)))
        == 3
    )
