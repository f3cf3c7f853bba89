"""A change whose first launch came short without being ruled out (agent/trial/firstlook.py): the
runner remembers that launch, one more look at the same change is judged together with it, and the
builtin planner offers that look once, after what is untried (agent/policy/trialqueue.another_looks). The deployment is the scripted-launch fake of
tests/test_paired_trial.py."""

from __future__ import annotations

import asyncio

from agent.policy.trialqueue import another_looks, next_trials
from agent.trial.firstlook import earlier_look, pooled
from agent.trial.record import TrialChange, TrialRecord
from tests.test_paired_trial import Launches, trial

CHANGE = TrialChange(flag="--enable-mixed-chunk")


def again(runner):  # type: ignore[no-untyped-def]
    return asyncio.run(runner.run([CHANGE], reason="another look"))


def test_a_short_first_launch_is_remembered_and_the_next_look_is_judged_with_it(monkeypatch):
    # first launch +0.4% everywhere: stopped for futility, but an interval up to +3% rules nothing out
    launches = Launches(a=[1.0] * 8, b=[1.004, 1.05, 1.05])
    runner, first = trial(monkeypatch, launches)
    assert first.decision == "rolled_back" and "futility" in first.why
    assert first.first_look is not None and first.first_look["ratio"] > 1
    assert first.first_look["ci_high"] >= 1.02
    # +5% on both launches of the next look: kept, and together with the first launch it still holds
    second = again(runner)
    assert second.decision == "kept"
    assert any("judged with trial 1's first launch" in n for n in second.notes)


def test_a_next_look_that_only_clears_the_bar_alone_is_not_kept(monkeypatch):
    # +2.4% at every level on each launch of the next look would be kept on its own (on a third
    # launch: a small gain alike at every level is what a faster restart looks like) ...
    alone = Launches(a=[1.0] * 8, b=[1.024, 1.024, 1.024])
    runner, record = trial(monkeypatch, alone)
    assert record.decision == "kept" and record.comparison["overall"]["launches_candidate"] == 3
    # ... but pooled with a first launch at +0.4% it is below the 2% minimum effect: rolled back
    launches = Launches(a=[1.0] * 8, b=[1.004, 1.024, 1.024, 1.024])
    runner, first = trial(monkeypatch, launches)
    second = again(runner)
    assert first.first_look is not None
    assert second.decision == "rolled_back" and launches.events[-1] == "rollback"
    assert "not with trial 1's first launch" in second.why and runner.kept_changes == []


def test_a_first_launch_below_no_change_or_regressed_is_not_a_short_look(monkeypatch):
    for speed in (0.99, 0.94):  # -1% (futility) and -6% (regressed)
        runner, record = trial(monkeypatch, Launches(a=[1.0] * 4, b=[speed]))
        assert record.decision == "rolled_back" and record.first_look is None


def test_only_the_same_change_is_pooled_whatever_was_kept_since():
    look = {"concurrency": 8, "ratio": 1.004, "ci_low": 0.98, "ci_high": 1.03}
    first = TrialRecord(number=1, changes=[CHANGE], first_look=look)
    # kept since: the later look runs on top of it, and must be improved on its own as well
    on_more = TrialRecord(number=3, changes=[CHANGE], on_top_of=[TrialChange(flag="--enable-torch-compile")])
    assert earlier_look([first], on_more) is first
    other = TrialRecord(number=3, changes=[TrialChange(flag="--enable-torch-compile")])
    assert earlier_look([first], other) is None
    value = TrialRecord(number=3, changes=[TrialChange(flag="--enable-mixed-chunk", value="x")])
    assert earlier_look([first], value) is None
    together = TrialRecord(number=3, kind="bundle", changes=[CHANGE])
    assert earlier_look([first], together) is None
    # inverse-variance pooling on the log scale: the sharper interval weighs more, the result is sharper
    sharp = type("I", (), {"ratio": 1.04, "ci_low": 1.03, "ci_high": 1.05})()
    ratio, low, high = pooled(look, sharp)
    assert 1.035 < ratio < 1.04 and high - low < 0.02


def _candidate(flag: str) -> dict:
    return {"flag": flag, "value": None, "action": "set", "expected_gain": 0.03, "helps": ""}


def test_the_planner_offers_one_more_look_after_the_untried_once():
    verdicts = {f: {"verdict": "applies", "confidence": "high"} for f in ("--a", "--b", "--c")}
    cands = [_candidate("--a"), _candidate("--b"), _candidate("--c")]
    look = {"concurrency": 8, "ratio": 1.004, "ci_low": 0.976, "ci_high": 1.032}
    short = {"trial": 1, "kind": "single", "decision": "rolled_back", "deployed": [], "first_look": look}
    tried = {"--a": [short]}
    offered = another_looks(cands, verdicts, tried)
    assert [(c["flag"], why.startswith("another look")) for _, _, c, why in offered] == [("--a", True)]
    queue = next_trials(cands, verdicts, tried)
    assert [c["flag"] for c, _ in queue] == ["--b", "--c", "--a"]  # the untried first
    # looked at twice already, or research unsure of it: no look
    assert another_looks(cands, verdicts, {"--a": [short, {**short, "trial": 3}]}) == []
    unsure = {**verdicts, "--a": {"verdict": "unknown", "confidence": "low"}}
    assert another_looks(cands, unsure, tried) == []
    # a first launch that ruled it out (no first_look), or a bundle's: none either
    assert another_looks(cands, verdicts, {"--a": [{**short, "first_look": None}]}) == []
    assert another_looks(cands, verdicts, {"--a": [{**short, "kind": "bundle"}]}) == []


def test_the_builtin_planner_gives_the_look_when_the_untried_are_done_and_says_why():
    from tests.test_bundles import APPLIES, _calls, cand, planner_policy_for

    cands = [cand("--a", "high", bar=0.02), cand("--b", "high", bar=0.02)]
    verdicts = {c["flag"]: {**APPLIES, "flag": c["flag"]} for c in cands}
    look = {"concurrency": 8, "ratio": 1.006, "ci_low": 0.98, "ci_high": 1.033}
    short = {
        "trial": 1, "kind": "single", "changes": ["--a"], "decision": "rolled_back", "deployed": [],
        "why": "stopped after 2 repetitions: no_change: no level can still reach +2% (futility)",
        "first_look": look,
    }  # fmt: skip
    history = [({"changes": [{"flag": "--a"}]}, short)]
    assert [
        c["flag"] for c in _calls(planner_policy_for(cands, verdicts, history))["run_trial"]["changes"]
    ] == ["--b"]
    other = {**short, "trial": 2, "changes": ["--b"], "first_look": None}
    run = _calls(planner_policy_for(cands, verdicts, [*history, ({"changes": [{"flag": "--b"}]}, other)]))
    assert [c["flag"] for c in run["run_trial"]["changes"]] == ["--a"]
    assert run["run_trial"]["reason"].startswith(
        "another look, judged with its first launch (c=8 +0.6% [-2.0..+3.3]"
    )
    # --b kept instead: the look runs on top of it all the same
    kept = {**other, "decision": "kept", "deployed": ["--b"]}
    calls = _calls(planner_policy_for(cands, verdicts, [*history, ({"changes": [{"flag": "--b"}]}, kept)]))
    assert [c["flag"] for c in calls["run_trial"]["changes"]] == ["--a"]
    # after that look nothing is left to try
    again = {**short, "trial": 3, "first_look": None}
    done = [*history, ({"changes": [{"flag": "--b"}]}, kept), ({"changes": [{"flag": "--a"}]}, again)]
    assert "run_trial" not in _calls(planner_policy_for(cands, verdicts, done))


def test_a_third_launch_gives_way_to_a_better_candidate_only_when_both_do_not_fit():
    from agent.trial.paired import crowds_out
    from agent.trial.record import Baseline
    from agent.trial.runner import TrialRunner
    from tools.bench.objective import objective_from_goal
    from tools.config import BenchConfig

    unit = "[Service]\nExecStart=/usr/bin/python -m sglang.launch_server --model-path /m\n"
    runner = TrialRunner(
        deployment=None, endpoint="http://127.0.0.1:1", bench=BenchConfig(),
        objective=objective_from_goal("improve throughput"), baseline=Baseline(reps=[], probe=None, text=unit),
        max_restarts=20,
    )  # fmt: skip
    miss = {"concurrency": 64, "ratio": 1.018, "ci_low": 0.998, "ci_high": 1.038}  # a near miss
    assert crowds_out(runner, miss, 10.0) is None  # nothing waits
    runner.waiting(0.048)  # applies at certainty 0.8, +6% expected
    assert crowds_out(runner, miss, 10.0) is None  # the budget fits both: the third launch goes
    runner.restarts = 15  # 5 left: the third launch (3) or the next trial (4), not both
    why = crowds_out(runner, miss, 10.0)
    assert why is not None and why.endswith("worth 4.80%")
    sure = {"concurrency": 64, "ratio": 1.08, "ci_low": 1.01, "ci_high": 1.15}
    assert crowds_out(runner, sure, 10.0) is None  # a near miss worth more than the one waiting
