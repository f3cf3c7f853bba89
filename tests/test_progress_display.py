"""A trial's benchmark is shown live (not a stale "waiting for the server"), and its final tok/s per
level is the number the results table shows."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace

import pytest
from rich.console import Console

from agent.ui import RunUI
from tools.bench.loadgen import Progress, run_sweep
from tools.config import BenchConfig


def test_the_last_live_figure_of_each_level_is_the_tables(sim_server) -> None:  # type: ignore[no-untyped-def]
    server = sim_server()
    seen: list[Progress] = []
    settings = BenchConfig(
        concurrency=[1, 8], input_len=64, output_len=32, prompts_per_level=8, warmup=1, reps=1
    )
    sweep = asyncio.run(run_sweep(server.endpoint, settings, on_progress=seen.append))
    assert not sweep.partial
    for level in sweep.levels:
        final = [p for p in seen if p.concurrency == level.max_concurrency and p.finished]
        assert len(final) == 1
        assert final[0].tokens_per_s == pytest.approx(level.output_throughput, rel=1e-9)


def test_a_trial_benchmark_replaces_the_waiting_bar() -> None:
    ui = RunUI(Console(file=io.StringIO(), force_terminal=True, width=120))
    ui.deploy_progress("wait:health", 1.0, 10.0)
    assert ui._wait_bar is not None
    ui.bench_progress(Progress(concurrency=8, done=3, total=16, output_tokens=900, elapsed_s=2.0))
    assert ui._wait_bar is None and ui._bench_bar is not None
    task = ui._bench_bar.tasks[0]
    assert task.completed == 3 and task.fields["info"] == "c=8 3/16 req 450 tok/s rep 1/1"
    ui.deploy_progress("wait:health", 0.5, 10.0)  # the next trial's restart: one live display at a time
    assert ui._bench_bar is None and ui._wait_bar is not None
    ui.note("done")
    assert ui._wait_bar is None and ui._bench_bar is None


def test_every_block_of_a_trial_is_named_with_its_number(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A near miss's six blocks (agent/trial/paired.py, on the scripted launches of
    tests/test_paired_trial.py): each one named with its number on the screen when done."""
    import agent.trial.steps as steps
    from agent.trial.record import Baseline, TrialChange
    from agent.trial.runner import TrialRunner
    from tests.test_paired_trial import UNIT, Launches
    from tools.bench.objective import objective_from_goal

    launches = Launches(a=[1.0, 1.0, 0.998], b=[1.02, 1.016, 1.04])

    async def measure(*args: object, **kw: object) -> list:
        return launches.block()

    async def nothing(*args: object) -> None:
        return None

    monkeypatch.setattr(steps, "measure", measure)
    monkeypatch.setattr(steps, "warm", nothing)
    monkeypatch.setattr(steps.Trial, "probe_ok", nothing)
    out = io.StringIO()
    recorded: list[str] = []
    ui = RunUI(
        Console(file=out, width=100),
        SimpleNamespace(event=lambda kind, data, msg=None: recorded.append(kind)),
    )
    runner = TrialRunner(
        deployment=launches, endpoint="http://127.0.0.1:9", bench=BenchConfig(),
        objective=objective_from_goal("improve throughput"), baseline=Baseline(reps=[], probe=None, text=UNIT),
        on_event=ui.record, on_progress=ui.bench_progress,
    )  # fmt: skip
    record = asyncio.run(runner.run([TrialChange(flag="--enable-mixed-chunk")], reason="test"))
    assert record.decision == "kept"
    lines = [line.strip() for line in out.getvalue().splitlines() if "· block" in line]
    names = ["known-good before", "candidate", "known-good after", "known-good after",
             "candidate, second launch", "known-good after the second launch",
             "known-good after the second launch", "candidate, third launch"]  # fmt: skip
    planned = [3, 3, 3, 5, 5, 8, 8, 8]  # A/B/A, then a second launch, then a third
    assert lines == [
        f"trial 1 · block {i}/{p}, {n} done: 3 repetitions in 0 s"
        for i, (n, p) in enumerate(zip(names, planned, strict=True), 1)
    ], lines
    assert "block" not in recorded and "trial" in recorded  # shown, not written to the transcript
