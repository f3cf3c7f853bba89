"""The launches a candidate gets (agent/trial/paired.py): A/B/A, a second launch of a likely winner,
a third launch of each side for a near miss. The deployment is a fake that only tracks which
configuration runs in which launch; each launch's blocks come from a scripted speed factor (no GPU
here, and the decision logic is what is under test: tests/test_run_e2e.py runs it on the simulator)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import pytest

from agent.trial.record import Baseline, TrialChange
from agent.trial.runner import TrialRunner
from tools.bench.objective import objective_from_goal
from tools.bench.results import LevelResult, SweepResult
from tools.config import BenchConfig
from tools.deploy.deployment import DeployOutcome

UNIT = """[Service]
ExecStart=/opt/venv/bin/python -m sglang.launch_server --model-path /models/m --port 30000
"""
LEVELS = {1: 120.0, 8: 400.0, 64: 1200.0}


def script_blocks(monkeypatch, launches: Launches, *, probe: bool = False) -> None:  # type: ignore[no-untyped-def]
    """Every block the trial code measures comes from `launches`; no warm-up (nor, unless `probe`,
    output probe) runs against the unreachable endpoint."""
    import agent.trial.steps as steps

    async def measure(*args: object, **kw: object):  # type: ignore[no-untyped-def]
        return launches.block()

    async def nothing(*args: object) -> None:
        return None

    monkeypatch.setattr(steps, "measure", measure)
    monkeypatch.setattr(steps, "warm", nothing)
    if not probe:
        monkeypatch.setattr(steps.Trial, "probe_ok", nothing)  # every kind of trial's


@dataclass
class Launches:
    """Known-good (A) or the candidate (B) runs; every deploy and rollback is a new launch whose
    speed is the next scripted factor of that side."""

    a: list[float]
    b: list[float]
    events: list[str] = field(default_factory=list)
    running: str = "A"
    factor: float = 1.0
    rng: random.Random = field(default_factory=lambda: random.Random(3))
    slow: dict[int, float] = field(default_factory=dict)
    """Block number (0: the first measured) -> share of its launch's speed it runs at (a load)."""
    slow_at: dict[int, int] = field(default_factory=dict)
    """Block number -> the one level its load hits (every level when not given)."""
    gain: dict[int, float] = field(default_factory=dict)
    """Level -> what the candidate's change itself multiplies there (the launch factor aside)."""
    measured: int = 0

    def __post_init__(self) -> None:
        self.factor = self.a.pop(0)

    async def deploy(self, text: str, *, reason: str) -> DeployOutcome:
        self.events.append("deploy")
        self.running, self.factor = "B", self.b.pop(0)
        return DeployOutcome(ok=True)

    async def rollback(self) -> DeployOutcome:
        self.events.append("rollback")
        self.running, self.factor = "A", self.a.pop(0)
        return DeployOutcome(ok=True)

    async def commit(self) -> None:
        self.events.append("commit")

    async def keepalive(self) -> bool:
        return True

    def block(self) -> list[SweepResult]:
        load, at = self.slow.get(self.measured, 1.0), self.slow_at.get(self.measured)
        self.measured += 1

        def sweep() -> SweepResult:
            levels = [
                LevelResult(
                    max_concurrency=c,
                    num_prompts=8,
                    completed=8,
                    output_throughput=t
                    * self.factor
                    * (load if at in (None, c) else 1.0)
                    * (1 + self.rng.gauss(0, 0.002))
                    * (self.gain.get(c, 1.0) if self.running == "B" else 1.0),
                )  # fmt: skip
                for c, t in LEVELS.items()
            ]
            return SweepResult(endpoint="http://x", api="completions", levels=levels)

        return [sweep() for _ in range(3)]


def trial(
    monkeypatch: pytest.MonkeyPatch,
    launches: Launches,
    *,
    won: float = 0.0,
    earlier: float | None = None,
    max_restarts: int | None = None,
    loaded: float | None = None,
) -> tuple[TrialRunner, object]:
    """One trial of a candidate; `won`: the known-good launch running is the one that won the
    previous trial (its block, measured at this share of the launch's speed, is the runner's
    reference and best); `earlier`: known-good was
    measured before on a launch of this speed factor (an earlier trial's block); `loaded`: the
    running known-good launch was measured before (after the last trial) at this share of its speed."""
    import agent.trial.steps as steps

    async def measure(*args: object, **kw: object) -> list[SweepResult]:
        return launches.block()

    async def nothing(*args: object) -> None:
        return None

    monkeypatch.setattr(steps, "measure", measure)
    monkeypatch.setattr(steps, "warm", nothing)
    monkeypatch.setattr(steps.Trial, "probe_ok", nothing)  # outputs identical
    runner = TrialRunner(
        deployment=launches, endpoint="http://127.0.0.1:9", bench=BenchConfig(),
        objective=objective_from_goal("improve throughput"), baseline=Baseline(reps=[], probe=None, text=UNIT),
    )  # fmt: skip
    runner.max_restarts = max_restarts
    if won:
        launches.slow[launches.measured] = won
        runner.reference = runner.best_reps = launches.block()
    if loaded is not None:
        speed, launches.factor = launches.factor, launches.factor * loaded
        runner.reference = launches.block()
        runner.known_good_blocks.append(runner.reference)
        launches.factor = speed
    if earlier is not None:
        running, launches.factor = launches.factor, earlier
        runner.known_good_blocks.append(launches.block())
        launches.factor = running
    change = TrialChange(flag="--enable-mixed-chunk", value=None)
    return runner, asyncio.run(runner.run([change], reason="test"))


def test_a_near_miss_gets_a_third_launch_of_each_side_and_is_kept_when_three_establish_it(monkeypatch):
    # +1.8% over two launches: below the 2% minimum effect, within a quarter of it
    launches = Launches(a=[1.0, 1.0, 0.998], b=[1.02, 1.016, 1.04])
    runner, record = trial(monkeypatch, launches)
    assert launches.events == ["deploy", "rollback", "deploy", "rollback", "deploy", "commit"]
    assert record.decision == "kept" and record.restarts == runner.restarts == 5
    assert record.comparison["overall"]["launches_candidate"] == 3
    assert set(record.blocks) == {"before", "candidate", "after", "confirm", "after_second", "third"}
    assert runner.known_good_blocks == [runner.reference]  # the kept candidate's third launch


def test_a_near_miss_that_its_third_launch_does_not_establish_is_rolled_back(monkeypatch):
    launches = Launches(a=[1.0, 1.0, 0.998, 1.0], b=[1.02, 1.016, 1.0])
    runner, record = trial(monkeypatch, launches)
    assert launches.events[-2:] == ["deploy", "rollback"] and "commit" not in launches.events
    assert record.decision == "rolled_back" and "not established over 3 launches" in record.why
    assert record.near_miss is None  # +1.2% over three launches: no longer near
    assert runner.deployed_text == UNIT


def test_only_a_near_miss_is_launched_a_third_time(monkeypatch):
    # established over two launches: kept without a third
    clear = Launches(a=[1.0, 1.0], b=[1.04, 1.035])
    _, record = trial(monkeypatch, clear)
    assert clear.events == ["deploy", "rollback", "deploy", "commit"] and record.decision == "kept"
    # the second launch shows half the first one's gain: +1.2%, not near the minimum effect
    fading = Launches(a=[1.0, 1.0, 1.0], b=[1.022, 1.002])
    _, record = trial(monkeypatch, fading)
    assert fading.events == ["deploy", "rollback", "deploy", "rollback"]
    assert "not established over 2 launches" in record.why and record.near_miss is None


def test_a_small_gain_the_same_at_every_level_gets_a_third_launch(monkeypatch):
    # +2.5% at c=1, c=8 and c=64 over two launches: what two fast launches of a no-op look like
    # (the restart spread is 1%). Improved by the rule, but a third launch of each side decides
    noop = Launches(a=[1.0, 1.0, 1.0, 1.0], b=[1.026, 1.024, 1.0])
    _, record = trial(monkeypatch, noop)
    assert noop.events == ["deploy", "rollback", "deploy", "rollback", "deploy", "rollback"]
    assert record.decision == "rolled_back" and "not established over 3 launches" in record.why
    # a lever that keeps its gain on the third launch is kept on three
    lever = Launches(a=[1.0, 1.0, 1.0, 1.0], b=[1.026, 1.024, 1.026])
    _, record = trial(monkeypatch, lever)
    assert lever.events[-1] == "commit" and record.comparison["overall"]["launches_candidate"] == 3
    # the same gain, but at one level only, is no launch factor: kept on two launches
    one_level = Launches(a=[1.0, 1.0, 1.0], b=[1.0, 1.0], gain={64: 1.035})
    _, record = trial(monkeypatch, one_level)
    assert one_level.events == ["deploy", "rollback", "deploy", "commit"]


def test_a_candidate_is_not_stopped_early_against_the_launch_that_just_won(monkeypatch):
    # the running known-good launch measured 2% high: a candidate that changes nothing looks -2%
    fresh = Launches(a=[1.02, 1.0], b=[1.0])
    _, record = trial(monkeypatch, fresh)
    assert fresh.events == ["deploy", "rollback"] and "after" not in record.blocks  # stopped at A/B
    assert record.why.startswith("stopped after")
    # the same numbers when that launch won the previous trial (kept because it measured high):
    # the after block, on the launch the rollback starts anyway, is measured before deciding
    won = Launches(a=[1.02, 1.0], b=[1.0])
    _, record = trial(monkeypatch, won, won=1.0)
    assert won.events == ["deploy", "rollback"] and "after" in record.blocks
    assert record.decision == "rolled_back" and not record.why.startswith("stopped after")


def test_a_clear_win_is_kept_on_one_launch_when_known_good_measures_as_before(monkeypatch):
    # +10% at c=64 against the launch that just won, or against a known-good block that agrees with
    # an earlier one: kept at the A/B look, one restart instead of three
    for launches, kw in (
        (Launches(a=[1.0], b=[1.0], gain={64: 1.10}), {"won": 1.0}),
        (Launches(a=[1.0], b=[1.0], gain={64: 1.10}), {"earlier": 1.003}),
    ):
        runner, record = trial(monkeypatch, launches, **kw)
        assert launches.events == ["deploy", "commit"], kw
        assert record.decision == "kept" and record.restarts == runner.restarts == 1
        assert "one launch" in record.why and set(record.blocks) == {"before", "candidate"}
        assert runner.known_good_blocks == [runner.reference]


def test_the_same_gain_at_every_level_goes_through_a_b_a_however_clear(monkeypatch):
    # a flag that changes nothing, launched as the machine got quieter: known-good's block and its
    # earlier one both ran 6% slow (they agree), the candidate 6.4% faster at every level. Not a
    # win one launch can tell from the machine: the after block, on a fresh launch, is measured
    launches = Launches(a=[1.0, 1.0, 1.0, 1.0], b=[1.0, 1.0, 1.0], slow={0: 0.94})
    _, record = trial(monkeypatch, launches, earlier=0.94)
    assert launches.events[:2] == ["deploy", "rollback"] and "after" in record.blocks
    assert "one launch" not in record.why
    # a real lever the same at every level still wins, over A/B/A and a second launch
    uniform = Launches(a=[1.0, 1.0, 1.0], b=[1.10, 1.10])
    _, record = trial(monkeypatch, uniform, earlier=1.003)
    assert uniform.events == ["deploy", "rollback", "deploy", "commit"] and record.decision == "kept"


def test_a_clear_looking_win_goes_through_a_b_a_when_known_good_measured_low_or_alone(monkeypatch):
    # known-good measured 12% below its earlier block (load on the machine while it ran): the
    # candidate's +12% at the A/B look is that drift; the after block, on a quiet machine, says so
    drifted = Launches(a=[0.88, 1.0, 1.0, 1.0], b=[1.0, 1.0, 1.0])
    _, record = trial(monkeypatch, drifted, earlier=1.0)
    assert drifted.events[:2] == ["deploy", "rollback"] and "after" in record.blocks
    assert record.decision == "rolled_back", drifted.events
    # the run's first block has nothing to agree with: a real +10% still gets its A/B/A and second launch
    alone = Launches(a=[1.0, 1.0], b=[1.10, 1.10])
    _, record = trial(monkeypatch, alone)
    assert alone.events == ["deploy", "rollback", "deploy", "commit"] and record.decision == "kept"


def test_a_known_good_block_measured_under_load_is_set_aside_before_the_candidate(monkeypatch):
    from agent.trial.record import samples_as_sweeps
    from tools.bench.paired import paired_compare

    # the block after the last trial ran 4% slow (a load); known-good is measured again, at its
    # launch's speed, before a candidate that changes nothing
    launches = Launches(a=[1.0, 1.0, 1.0], b=[1.0, 1.0])
    runner, record = trial(monkeypatch, launches, loaded=0.96)
    assert record.decision == "rolled_back" and record.why.startswith("stopped after")
    assert record.blocks["before_set_aside"] == 3 and "slower one was set aside" in record.notes[0]
    # that launch's entry in the known-good history is the block measured at its speed
    assert [len(b) for b in runner.known_good_blocks] == [3]
    blocks = {k: samples_as_sweeps(v, record.seeds[k]) for k, v in record.samples.items()}
    # against the loaded block the same candidate measured a gain
    loaded = paired_compare(blocks["before_set_aside"], blocks["candidate"], None, runner.objective)
    assert loaded.verdict == "improved" and loaded.ratio > 1.03
    # `optagent transcripts show` says what was set aside
    from agent.transcripts.review import trial_record

    shown = trial_record(1, {"data": record.model_dump(mode="json")}, {})
    assert "slower one was set aside" in shown.extra["notes"]


def test_the_block_that_won_is_replaced_not_settled_with(monkeypatch):
    # the winning candidate's block measured 3% above its launch (kept because it measured high):
    # known-good's fresh block is the reference, though the two disagree and it is the slower one
    launches = Launches(a=[1.0, 1.0], b=[1.0])
    runner, record = trial(monkeypatch, launches, won=1.03)
    assert "before_set_aside" not in record.blocks and not record.notes
    before = [rep[64]["output_throughput"] for rep in record.samples["before"]]
    assert len(before) == 3 and all(abs(v / LEVELS[64] - 1) < 0.01 for v in before)


def test_a_loaded_block_after_the_rollback_is_set_aside_before_the_second_launch(monkeypatch):
    # a real +3% whose after block (block 2) ran 4% slow: A/B/A sends it to a second launch, and
    # known-good's launch is measured again before it is left; that block sets the loaded one aside
    launches = Launches(a=[1.0, 1.0, 1.0, 1.0], b=[1.03, 1.03, 1.03], slow={2: 0.96})
    _, record = trial(monkeypatch, launches)
    assert record.blocks["after_set_aside"] == 3 and "the earlier, slower one" in record.notes[0]
    after = [rep[64]["output_throughput"] for rep in record.samples["after"]]
    assert all(abs(v / LEVELS[64] - 1) < 0.01 for v in after)
    assert record.decision == "kept" and record.comparison["overall"]["launches_candidate"] >= 2


def test_a_known_good_launch_that_came_out_faster_is_measured_once(monkeypatch):
    # a real +4% whose known-good second launch runs 1% faster than its first: a load during that
    # block could only hide a gain, so the block stands and the second candidate launch follows
    faster = Launches(a=[1.0, 1.01], b=[1.04, 1.04])
    _, record = trial(monkeypatch, faster)
    assert faster.events == ["deploy", "rollback", "deploy", "commit"] and record.decision == "kept"
    assert record.blocks["after"] == 3 and faster.measured == 4  # before, candidate, after, confirm
    # 1% slower: measured once more before it is left, and the two blocks of that launch settle
    slower = Launches(a=[1.0, 0.99], b=[1.04, 1.04])
    _, record = trial(monkeypatch, slower)
    assert slower.events == faster.events and record.blocks["after"] == 6 and slower.measured == 5


def test_a_known_good_launch_slower_only_where_the_candidate_wins_is_measured_again(monkeypatch):
    # a real +4% at c=64; known-good's second launch runs 2% faster, but its block after the
    # rollback carries a 4% load during its c=64 part: faster on the objective (+0.6%), slower at the
    # level the candidate wins at. That is the level it is judged on, so the launch is measured again
    # and the loaded block set aside before the candidate's second launch
    launches = Launches(
        a=[1.0, 1.02, 1.02], b=[1.0, 1.0, 1.0], gain={64: 1.04}, slow={2: 0.96}, slow_at={2: 64}
    )
    _, record = trial(monkeypatch, launches)
    assert record.blocks["after_set_aside"] == 3 and "the earlier, slower one" in record.notes[0]
    after = [rep[64]["output_throughput"] for rep in record.samples["after"]]
    assert all(abs(v / (1.02 * LEVELS[64]) - 1) < 0.01 for v in after)  # the unloaded block stands


def test_the_restart_budget_bounds_a_trial_and_its_third_launch(monkeypatch):
    from agent.trial.record import BudgetExhausted

    # the near miss of the first test, with restarts for A/B/A, a second launch and its rollback
    # only: no third launch, rolled back after four restarts
    launches = Launches(a=[1.0, 1.0, 0.998], b=[1.02, 1.016])
    runner, record = trial(monkeypatch, launches, max_restarts=4)
    assert launches.events == ["deploy", "rollback", "deploy", "rollback"]
    assert "no restarts left for a third" in record.why and runner.restarts == 4
    # still a near miss: its best judged level (c=1, the least noisy, as all move together) is
    # recorded for a second look later in the run
    miss = record.near_miss
    assert miss is not None and miss["launches_candidate"] == 2
    assert 1.015 < miss["ratio"] < 1.02 and miss["ci_low"] < 1.02 < miss["ci_high"]
    # three restarts left: a trial that may need four does not start, and the target is untouched
    untouched = Launches(a=[1.0], b=[1.1])
    with pytest.raises(BudgetExhausted, match="restart budget spent"):
        trial(monkeypatch, untouched, max_restarts=3)
    assert untouched.events == []


def test_a_trial_whose_known_good_moved_beyond_its_spread_is_marked_disturbed_not_judged(monkeypatch):
    # the candidate gains +1.5% at the A/B look; known-good's after launch runs 12% faster than its
    # before block (a load that went away): -4% against their midpoint is the machine's doing
    launches = Launches(a=[1.0, 1.12], b=[1.015])
    _, record = trial(monkeypatch, launches, earlier=0.99)
    assert record.decision == "rolled_back" and "after" in record.blocks
    assert record.disturbed["concurrency"] in (1, 8, 64) and abs(record.disturbed["drift"] - 1.12) < 0.01
    assert "the machine, not the flag, decided this one" in record.why
    # a quiet machine: the same no-op is stopped at the A/B look, nothing marked
    quiet = Launches(a=[1.0, 1.0], b=[1.0])
    _, record = trial(monkeypatch, quiet, earlier=0.99)
    assert "after" not in record.blocks and record.disturbed is None


def test_no_early_stop_against_a_known_good_block_that_moved_far_from_its_last_one(monkeypatch):
    # known-good measured 15% slower before (a load then): the A/B look cannot be trusted to stop a
    # no-op early; the after block (its rollback is needed anyway) decides
    moved = Launches(a=[1.0, 1.0], b=[1.0])
    _, record = trial(monkeypatch, moved, earlier=0.85)
    assert (
        "after" in record.blocks
        and record.decision == "rolled_back"
        and moved.events == ["deploy", "rollback"]
    )
