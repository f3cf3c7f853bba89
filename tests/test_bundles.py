"""Small levers tried together (agent/policy/order.py plan_bundle, the builtin planner) and a kept
bundle's doubtful member left out unless it proves itself (agent/trial/prune.py). The deployment is
the scripted-launch fake of tests/test_paired_trial.py: the decision logic is under test."""

from __future__ import annotations

import asyncio

from agent.policy.order import establishable
from agent.policy.trialqueue import doubtful_members, next_trials, plan_bundle
from agent.trial.record import Baseline, TrialChange, TrialRecord
from agent.trial.runner import TrialRunner
from tests.test_order import _calls, _history
from tests.test_paired_trial import UNIT, Launches, script_blocks
from tools.bench.objective import objective_from_goal
from tools.config import BenchConfig

APPLIES = {"verdict": "applies", "summary": "read here"}


def cand(
    flag: str, priority: str, *, factor: float = 1.0, acts: list[int] | None = None, bar: float = 0.06
) -> dict:
    return {
        "flag": flag, "value": None, "action": "set", "priority": priority, "status": "candidate",
        "note": "", "lossy": False, "helps": "h", "state_factor": factor, "establishable": bar,
        "acts_at_levels": [1, 8, 64] if acts is None else acts,
    }  # fmt: skip


def test_establishable_grows_with_the_restart_spread_and_stays_above_the_minimum_effect():
    assert abs(establishable(0.001, 0.02) - 0.02084) < 1e-9
    # below 1.02% the minimum effect binds: at 0.5% a lever at exactly +2% would be kept half the time
    assert abs(establishable(0.005, 0.02) - 0.0242) < 1e-9
    assert abs(establishable(0.025, 0.02) - 0.07) < 1e-9


def test_candidates_below_what_one_trial_can_establish_go_together_and_a_big_one_alone():
    # 2.5% spread: one trial establishes ~7%; medium (4%) and low (2%) levers are small, high x1.5 is not
    cands = [cand("--big", "high", factor=1.5), cand("--mid", "medium"), cand("--small", "low")]
    verdicts = {c["flag"]: APPLIES for c in cands}
    members, why = plan_bundle(cands, verdicts, {})
    assert [c["flag"] for c in members] == ["--mid", "--small"]
    assert "below +6.0%" in why and "--mid (+4.0%)" in why
    queue = next_trials(cands, verdicts, {})
    assert [c["flag"] for c, _ in queue] == ["--big", "--mid + --small"]
    assert [c["flag"] for c in queue[1][0]["bundle"]] == ["--mid", "--small"]


def test_no_bundle_of_one_nor_of_a_lever_acting_nowhere_or_doubted_by_the_playbook():
    verdicts = {f: APPLIES for f in ("--a", "--b", "--c")}
    alone = [cand("--a", "low"), cand("--b", "high", factor=2.0)]
    assert plan_bundle(alone, verdicts, {}) is None
    nowhere = [cand("--a", "low"), cand("--b", "low", acts=[]), {**cand("--c", "low"), "status": "no-op"}]
    assert plan_bundle(nowhere, verdicts, {}) is None
    # with the spread declared small, nothing is small: every lever alone
    assert (
        plan_bundle([cand("--a", "medium", bar=0.03), cand("--c", "medium", bar=0.03)], verdicts, {}) is None
    )


def test_a_lever_known_to_cost_at_a_measured_level_is_never_tried_together():
    # fewer speculative steps: it acts at the batches of c=64 and costs single streams at c=1
    costly = {**cand("--steps", "low", acts=[64]), "costs_at_levels": [1, 8]}
    cands = [cand("--mid", "medium"), cand("--small", "low"), costly]
    verdicts = {c["flag"]: APPLIES for c in cands}
    members, _ = plan_bundle(cands, verdicts, {})
    assert [c["flag"] for c in members] == ["--mid", "--small"]
    assert plan_bundle([cand("--mid", "medium"), costly], verdicts, {}) is None
    # nor in the bundle of what the budget cannot try one at a time: it keeps a slot of its own
    queue = next_trials([cand("--a", "high", bar=0.02), *cands], verdicts, {}, slots=2)
    assert {c["flag"] for c, _ in queue} == {"--a", "--mid + --small", "--steps"}


def test_the_playbook_says_where_fewer_speculative_steps_and_longer_prefill_chunks_cost():
    from types import SimpleNamespace

    from agent.policy.loadstate import acts_at, costs_at
    from agent.policy.playbook import load_playbook

    steps = next(lv for lv in load_playbook() if lv.flag == "--speculative-num-steps")
    state = SimpleNamespace(levels={1: {}, 8: {}, 64: {}})
    state.level_facts = lambda c: {"level.running": {1: 1.0, 8: 7.6, 64: 52.4}[c]}
    assert acts_at(steps, state) == [64] and costs_at(steps, state) == [1, 8]
    # a longer prefill chunk holds up the decodes running beside it: not at c=1, where none do
    chunks = next(lv for lv in load_playbook() if lv.flag == "--chunked-prefill-size")
    assert costs_at(chunks, state) == [8, 64]
    graphs = next(lv for lv in load_playbook() if lv.flag == "--cuda-graph-max-bs")
    assert costs_at(graphs, state) == []  # no known cost: free to go together


def test_a_kept_bundle_s_doubtful_members_are_the_unsure_and_those_acting_elsewhere():
    members = [
        cand("--sure", "medium", acts=[64]),
        cand("--unsure", "low"),
        cand("--low-only", "low", acts=[1]),
    ]
    verdicts = {"--sure": APPLIES, "--unsure": {"verdict": "unknown"}, "--low-only": APPLIES}
    doubtful = doubtful_members(members, verdicts, won_at=[64])
    assert [(c["flag"], why.split(" ")[0]) for c, why in doubtful] == [
        ("--unsure", "research"),
        ("--low-only", "its"),
    ]


def test_the_builtin_planner_tries_the_small_levers_as_one_change_then_leaves_out_the_doubtful():
    cands = [cand("--mid", "medium", acts=[1, 64]), cand("--small", "low", acts=[1])]
    verdicts = {c["flag"]: {**APPLIES, "flag": c["flag"]} for c in cands}
    run = _calls(planner_policy_for(cands, verdicts, []))["run_trial"]
    assert [c["flag"] for c in run["changes"]] == ["--mid", "--small"]
    assert run["together_reason"].startswith(
        "tried together: --mid (+4.0%), --small (+2.0%) each expected below +6.0% at c=1,"
    )
    kept = {
        "trial": 1,
        "changes": ["--mid", "--small"],
        "decision": "kept",
        "why": "improved",
        "won_at": [64],
    }
    calls = _calls(planner_policy_for(cands, verdicts, [(run, kept)]))
    assert calls["leave_out"]["flag"] == "--small" and "bundle won at c=64" in calls["leave_out"]["reason"]


def planner_policy_for(cands: list[dict], verdicts: dict, bundles: list[tuple[dict, dict]]):  # type: ignore[no-untyped-def]
    from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart

    from agent.policy.builtin.policy import planner_policy

    history = _history(cands, verdicts, [])
    for i, (args, result) in enumerate(bundles):
        call = ToolCallPart("run_trial", args, tool_call_id=f"b{i}")
        history += [
            ModelResponse(parts=[call]),
            ModelRequest(parts=[ToolReturnPart("run_trial", result, tool_call_id=f"b{i}")]),
        ]
    return planner_policy(history, None)


def leave_out(monkeypatch, launches: Launches) -> tuple[TrialRunner, TrialRecord]:  # type: ignore[no-untyped-def]
    """Leave --enable-mixed-chunk out of a kept bundle (with --cuda-graph-max-bs-decode 64) on `launches`
    (A: the bundle, B: without the member)."""
    script_blocks(monkeypatch, launches)
    runner = TrialRunner(
        deployment=launches, endpoint="http://127.0.0.1:9", bench=BenchConfig(),
        objective=objective_from_goal("improve throughput"), baseline=Baseline(reps=[], probe=None, text=UNIT),
    )  # fmt: skip
    member = TrialChange(flag="--enable-mixed-chunk")
    bundle = [TrialChange(flag="--cuda-graph-max-bs-decode", value="64"), member]
    runner.best = TrialRecord(number=1, kind="bundle", changes=bundle, decision="kept")
    return runner, asyncio.run(runner.run([member], reason="doubtful", kind="leave_out"))


def test_a_member_that_changes_nothing_is_left_out_on_one_restart(monkeypatch):
    launches = Launches(a=[1.0], b=[1.001])
    runner, record = leave_out(monkeypatch, launches)
    assert launches.events == ["deploy", "commit"] and record.decision == "kept"
    assert [c.describe() for c in runner.kept_changes] == ["--cuda-graph-max-bs-decode 64"]
    assert "--enable-mixed-chunk" not in runner.deployed_text
    assert record.headline().startswith("trial 1 [leave out --enable-mixed-chunk]")
    assert "left out" in record.why


def test_a_member_the_bundle_needs_stays(monkeypatch):
    # without it the server is 6% slower on both of its launches
    launches = Launches(a=[1.0, 1.0], b=[0.94])
    runner, record = leave_out(monkeypatch, launches)
    assert launches.events == ["deploy", "rollback"] and record.decision == "rolled_back"
    assert "stays in the bundle" in record.why
    assert "--enable-mixed-chunk" in runner.deployed_text


def test_a_member_whose_cost_the_a_b_look_suggests_but_a_b_a_does_not_establish_is_left_out(monkeypatch):
    # the A/B look: -2% (known-good measured high on its first launch); A/B/A: -1%, not established
    launches = Launches(a=[1.02, 1.0], b=[1.0, 1.0])
    runner, record = leave_out(monkeypatch, launches)
    assert launches.events == ["deploy", "rollback", "deploy", "commit"]
    assert record.decision == "kept" and "(A/B/A)" in record.why
    assert [c.flag for c in runner.kept_changes] == ["--cuda-graph-max-bs-decode"]


def test_the_review_and_the_report_say_what_was_tried_together_and_why(tmp_path):
    from types import SimpleNamespace

    from agent.transcripts.load import load_transcript
    from agent.transcripts.markdown import review_markdown
    from agent.transcripts.report import render_report
    from agent.transcripts.review import build_review
    from agent.transcripts.transcript import Transcript

    why = "small levers tried together; tried together: --a (+2.0%), --b (+2.0%) each expected below +2.8%"
    bundle = TrialRecord(
        number=1, kind="bundle", changes=[TrialChange(flag="--a"), TrialChange(flag="--b")], reason=why,
        decision="kept", why="improved: better by >= 2% at c=64",
    )  # fmt: skip
    left = TrialRecord(
        number=2, kind="leave_out", changes=[TrialChange(flag="--b")], on_top_of=bundle.changes,
        decision="kept", why="--b left out: without it c=64 +0.1% [-2.0..+2.2] (A/B)",
    )  # fmt: skip
    tx = Transcript.create(tmp_path, kind="run", goal="improve throughput", model="builtin", target="sim")
    tx.event("load_state", {"text": "c=64: running batch ~52 (beyond the captured 32), 0 waiting, KV 6%"})
    tx.event("launch_spread", {"text": "launch spread: measured 1.2% over 3 launches of known-good"})
    for t in (bundle, left):
        tx.event("trial", t.model_dump(mode="json"))
    tx.close({"status": "completed", "kept": ["--a"]})
    text = review_markdown(build_review(load_transcript(tx.path)))
    measured = text.split("## Measured on this deployment")[1].split("##")[0]
    assert "beyond the captured 32" in measured and "measured 1.2% over 3 launches" in measured
    trial_1 = text.split("### Trial 1")[1].split("### Trial 2")[0]
    assert "bundle" in trial_1 and "each expected below +2.8%" in trial_1
    assert "leave_out" in text.split("### Trial 2")[1]
    result = SimpleNamespace(
        status="completed", transcript=tx.path, kept=["--a"], trials=[bundle, left], restarts=3, seconds=60.0,
        budget="", measured=["launch spread: measured 1.2%"], conclusion="", untried={}, rule="r",
        baseline={}, final={},
    )  # fmt: skip
    report = render_report(result, plot_name=None)
    together = report.split("## Tried together")[1].split("##")[0]
    assert "trial 1 `--a, --b`: kept; small levers tried together" in together
    assert "trial 2, `--b` left out: --b left out" in together
    assert "- launch spread: measured 1.2%" in report and "bundle: --a, --b" in report


def test_a_member_expected_below_the_minimum_effect_is_doubtful_however_sure_research_is():
    members = [cand("--real", "medium", acts=[64]), {**cand("--bookkeeping", "low"), "expected_gain": 0.01}]
    verdicts = {"--real": APPLIES, "--bookkeeping": {"verdict": "applies", "certainty": 0.9}}
    doubtful = doubtful_members(members, verdicts, won_at=[64])
    assert [(c["flag"], why) for c, why in doubtful] == [
        ("--bookkeeping", "expected +1.0% here, below the +2% minimum effect")
    ]
    from agent.policy.playbook import load_playbook

    assert {lv.flag: lv.expected_gain for lv in load_playbook()}["--disable-radix-cache"] == 0.01


def test_what_the_budget_cannot_try_one_at_a_time_goes_together_in_its_last_slot():
    cands = [
        cand(f"--{n}", p, bar=0.02)
        for n, p in (("a", "high"), ("b", "high"), ("c", "medium"), ("d", "medium"))
    ]
    cands.append({**cand("--unsure", "medium", bar=0.02)})
    verdicts = {c["flag"]: APPLIES for c in cands} | {"--unsure": {"verdict": "applies", "certainty": 0.3}}
    # room for everything: one at a time, as before
    assert [c["flag"] for c, _ in next_trials(cands, verdicts, {}, slots=5)] == [
        "--a", "--b", "--c", "--d", "--unsure"
    ]  # fmt: skip
    queue = next_trials(cands, verdicts, {}, slots=2)
    assert [c["flag"] for c, _ in queue] == ["--a", "--b + --c + --d", "--unsure"]
    assert queue[1][1].startswith("the budget left fits about 2 more trials and 5 are open: --b, --c, --d")
    assert queue[1][0]["together"].startswith("more levers than the budget has trials for")
    # one slot: every sure candidate in it; an unsure one is never bundled (it would be left out again)
    assert [c["flag"] for c, _ in next_trials(cands, verdicts, {}, slots=1)][0] == "--a + --b + --c + --d"
    # a near miss's second look and levers expected at or below the minimum effect stay alone
    tried = {"--a": [{"near_miss": {"ratio": 1.05, "ci_low": 1.01, "ci_high": 1.09}}]}
    low = [
        *cands[1:4],
        {**cand("--tiny", "low", bar=0.02), "expected_gain": 0.01},
        cand("--low", "low", bar=0.02),
    ]
    queue = next_trials([cands[0], *low], verdicts | {"--tiny": APPLIES, "--low": APPLIES}, tried, slots=1)
    assert {c["flag"] for c, _ in queue} == {"--b + --c + --d", "--a", "--tiny", "--low"}


def test_a_slow_start_counts_its_trial_cost_against_the_slots_left():
    # the simulated 4 x H100 (bench_policy.py --minutes 60): with 2.2 trials' time left, mixed chunk and
    # then torch.compile (1.3 trials: both its starts compile) did not fit; torch.compile was refused
    cands = [
        cand("--mixed", "medium", bar=0.02),
        {**cand("--compile", "medium", bar=0.02), "trial_cost": 1.3},
        cand("--low", "low", bar=0.02),
    ]
    verdicts = {c["flag"]: APPLIES for c in cands}
    queue = next_trials(cands, verdicts, {}, slots=2.2)
    assert [c["flag"] for c, _ in queue] == ["--mixed + --compile", "--low"]
    assert queue[0][1].startswith(
        "the budget left fits about 2.2 more trials and 3 are open: --mixed, --compile"
    )
    # time for both, one at a time: as before, and the slow one as fast as the others is not bundled
    assert [c["flag"] for c, _ in next_trials(cands, verdicts, {}, slots=2.4)] == [
        "--mixed",
        "--compile",
        "--low",
    ]
    fast = [cands[0], {**cands[1], "trial_cost": 1.0}, cands[2]]
    assert [c["flag"] for c, _ in next_trials(fast, verdicts, {}, slots=2.2)] == [
        "--mixed",
        "--compile",
        "--low",
    ]


def test_the_sure_members_of_a_bundle_of_small_levers_join_the_budget_s_and_the_rest_stays_together():
    # 1.7% spread: one trial establishes ~4.8%; medium (4%) and the two 1% levers are small
    cands = [cand(f, "high", factor=1.5, bar=0.048) for f in ("--a", "--b")] + [
        cand("--mid", "medium", bar=0.048)
    ]
    cands += [{**cand(f, "low", bar=0.048), "expected_gain": 0.01} for f in ("--tiny", "--tinier")]
    verdicts = {c["flag"]: APPLIES for c in cands}
    assert [c["flag"] for c, _ in next_trials(cands, verdicts, {})] == [
        "--a",
        "--b",
        "--mid + --tiny + --tinier",
    ]
    queue = next_trials(cands, verdicts, {}, slots=2)
    assert [c["flag"] for c, _ in queue] == ["--a", "--b + --mid", "--tiny + --tinier"]
    assert queue[2][0]["together"] == "small levers tried together"


def test_the_runner_counts_the_trials_its_wall_time_and_restarts_still_fit():
    import time

    runner = TrialRunner(
        deployment=None, endpoint="http://127.0.0.1:9", bench=BenchConfig(),
        objective=objective_from_goal("improve throughput"), baseline=Baseline(reps=[], probe=None, text=UNIT),
        max_trials=12, max_restarts=20,
    )  # fmt: skip
    assert runner.trials_left() == 10  # 20 restarts, two a trial before any was measured
    runner.trials = [
        TrialRecord(number=i, changes=[], deployed=True, seconds=100.0, restarts=4) for i in (1, 2)
    ]
    runner.restarts = 8
    assert runner.trials_left() == 3  # 12 restarts left, 4 a trial
    runner.deadline = time.monotonic() + 250
    assert 2.4 <= runner.trials_left() <= 2.5  # 250 s left, 100 s a trial (to a tenth, rounded down)
    runner.deadline = time.monotonic() + 150
    assert 1.4 <= runner.trials_left() <= 1.5  # by the average
    runner.deadline = time.monotonic() - 1
    assert runner.trials_left() == 0  # the budget lets none start


def test_the_builtin_planner_bundles_what_the_budget_left_cannot_try_alone():
    cands = [cand(f"--{n}", "high", bar=0.02) for n in ("a", "b", "c", "d")]
    verdicts = {c["flag"]: {**APPLIES, "flag": c["flag"]} for c in cands}
    # before any trial, the candidate list says what the budget fits
    run = _calls(planner_policy_for([{**c, "trials_left": 3} for c in cands], verdicts, []))["run_trial"]
    assert [c["flag"] for c in run["changes"]] == ["--a"]
    run = _calls(planner_policy_for([{**c, "trials_left": 2} for c in cands], verdicts, []))["run_trial"]
    assert [c["flag"] for c in run["changes"]] == ["--a"]
    run = _calls(planner_policy_for([{**c, "trials_left": 1} for c in cands], verdicts, []))["run_trial"]
    assert [c["flag"] for c in run["changes"]] == ["--a", "--b", "--c", "--d"]
    first = {"trial": 1, "changes": ["--a"], "decision": "kept", "why": "improved", "trials_left": 2}
    run = _calls(planner_policy_for(cands, verdicts, [({"changes": [{"flag": "--a"}]}, first)]))["run_trial"]
    assert [c["flag"] for c in run["changes"]] == ["--b"]
    second = {**first, "trial": 2, "changes": ["--b"], "trials_left": 1}
    history = [({"changes": [{"flag": "--a"}]}, first), ({"changes": [{"flag": "--b"}]}, second)]
    run = _calls(planner_policy_for(cands, verdicts, history))["run_trial"]
    assert [c["flag"] for c in run["changes"]] == ["--c", "--d"]
    assert (
        run["reason"].startswith("more levers than the budget")
        and "fits about 1 more trial and" in run["together_reason"]
    )


def test_a_sure_member_of_a_bundle_that_regressed_gets_one_trial_alone():
    # a100x2-mixtral at 75f784a: torch.compile rode with --disable-radix-cache, whose lost prefix
    # reuse cost -26% at c=64 on the shared-prefix mix; torch.compile itself was never judged
    cands = [
        cand("--compile", "medium"),
        cand("--chunk", "low"),
        {**cand("--radix", "low"), "expected_gain": 0.01},
    ]
    verdicts = {c["flag"]: {**APPLIES, "flag": c["flag"]} for c in cands}
    run = _calls(planner_policy_for(cands, verdicts, []))["run_trial"]
    assert [c["flag"] for c in run["changes"]] == ["--compile", "--chunk", "--radix"]
    sunk = {
        "trial": 1,
        "kind": "bundle",
        "decision": "rolled_back",
        "verdict": "regressed",
        "why": "regressed",
    }
    again = _calls(planner_policy_for(cands, verdicts, [(run, sunk)]))["run_trial"]
    # only the member research is sure of and that may be worth the minimum effect, and not as a bundle
    assert [c["flag"] for c in again["changes"]] == ["--compile"] and "together_reason" not in again
    assert "a bundle it was in regressed" in again["reason"]
    tried = {f: [sunk] for f in ("--compile", "--chunk", "--radix")}
    assert [c["flag"] for c, _ in next_trials(cands, verdicts, tried)] == ["--compile"]
    # judged alone once: never again; a bundle that merely was not established frees no member
    assert next_trials(cands, verdicts, {**tried, "--compile": [sunk, {"decision": "rolled_back"}]}) == []
    flat = {**sunk, "verdict": "no_change"}
    assert next_trials(cands, verdicts, {f: [flat] for f in tried}) == []


def _miss(level: int, ratio: float, low: float, high: float) -> dict:
    return {"concurrency": level, "ratio": ratio, "ci_low": low, "ci_high": high, "launches_candidate": 3}


def test_near_misses_at_one_level_get_one_second_look_together_and_a_near_missed_bundle_whole():
    from agent.policy.order import second_look_value
    from agent.policy.trialqueue import second_looks

    # h200x8-deepseekv3 at 934fd69: mixed chunk came near at c=64 alone (+2.3% [-1.0..+5.7]), the
    # fused-MoE sum in a bundle (+1.7% [-1.0..+4.4]); each was then worth a trial alone
    cands = [cand(f, "medium") for f in ("--mixed", "--moe-sum", "--compile", "--other")]
    verdicts = {c["flag"]: APPLIES for c in cands}
    alone = {"trial": 1, "decision": "rolled_back", "near_miss": _miss(64, 1.023, 0.990, 1.057)}
    bundle = {
        "trial": 2,
        "kind": "bundle",
        "decision": "rolled_back",
        "near_miss": _miss(64, 1.017, 0.990, 1.044),
    }
    far = {"trial": 3, "decision": "rolled_back", "near_miss": _miss(8, 1.05, 1.01, 1.09)}
    tried = {"--mixed": [alone], "--moe-sum": [bundle], "--compile": [bundle], "--other": [far]}
    queue = next_trials(cands, verdicts, tried)
    assert [c["flag"] for c, _ in queue] == ["--other", "--mixed + --moe-sum + --compile"]
    look, why = queue[1]
    assert look["second_look"] and [m["flag"] for m in look["bundle"]] == [
        "--mixed",
        "--moe-sum",
        "--compile",
    ]
    assert why.startswith("second look together: --mixed, --moe-sum, --compile came near at c=64")
    assert "+2.3%, +1.7% in 2 trials" in why and queue[0][1] == "second look at a near miss"
    # worth more than the two second looks apart: the gains add (+4.0%), their noise in quadrature
    together = next(v for v, _, c, _ in second_looks(cands, tried) if c.get("second_look"))
    apart = second_look_value(cands[0], alone["near_miss"]) + second_look_value(cands[1], bundle["near_miss"])
    assert together > 0.035 and together > apart
    # a bundle that came near on its own is tried again whole, once: not member by member
    queue = next_trials(cands, verdicts, {"--moe-sum": [bundle], "--compile": [bundle]})
    assert [c["flag"] for c, _ in queue][-1] == "--moe-sum + --compile"
    assert queue[-1][1] == "second look at a bundle that came near: --moe-sum, --compile at c=64 (+1.7%)"
    # the budget's last slot leaves a second look as it is
    queue = next_trials(cands, verdicts, tried, slots=1)
    assert [c["flag"] for c, _ in queue] == ["--other", "--mixed + --moe-sum + --compile"]
    # tried a second time (together): no third look
    again = {
        "trial": 4,
        "kind": "bundle",
        "decision": "rolled_back",
        "near_miss": _miss(64, 1.03, 0.99, 1.07),
    }
    twice = {f: [*r, again] for f, r in tried.items() if f != "--other"}
    assert [(c["flag"], why) for c, why in next_trials(cands, verdicts, twice)] == [("--other", "untried")]


def test_the_builtin_planner_tries_near_misses_at_one_level_together_then_leaves_out_the_doubtful():
    cands = [cand("--mixed", "medium", acts=[8, 64]), cand("--compile", "medium", acts=[1, 8])]
    cands.append(cand("--moe-sum", "high", acts=[64]))
    verdicts = {c["flag"]: {**APPLIES, "flag": c["flag"]} for c in cands}
    history = [
        ({"changes": [{"flag": "--moe-sum"}]}, {"trial": 1, "decision": "rolled_back", "why": "not established",
                                                "near_miss": _miss(64, 1.025, 0.99, 1.06)}),
        ({"changes": [{"flag": "--mixed"}]}, {"trial": 2, "decision": "rolled_back", "why": "not established",
                                              "near_miss": _miss(64, 1.02, 0.99, 1.05)}),
        ({"changes": [{"flag": "--compile"}]}, {"trial": 3, "decision": "rolled_back", "why": "no_change"}),
    ]  # fmt: skip
    run = _calls(planner_policy_for(cands, verdicts, history))["run_trial"]
    assert [c["flag"] for c in run["changes"]] == ["--moe-sum", "--mixed"]
    assert run["together_reason"].startswith("second look together: --moe-sum, --mixed came near at c=64")
    kept = {"trial": 4, "kind": "bundle", "decision": "kept", "why": "improved", "won_at": [64]}
    calls = _calls(planner_policy_for(cands, verdicts, [*history, (run, kept)]))
    # both act at c=64 and research is sure of both: kept together, nothing to leave out, no other look
    assert "leave_out" not in calls and "run_trial" not in calls
    unsure = verdicts | {"--mixed": {**verdicts["--mixed"], "certainty": 0.3}}
    calls = _calls(planner_policy_for(cands, unsure, [*history, (run, kept)]))
    assert calls["leave_out"]["flag"] == "--mixed"


def test_small_levers_go_together_at_the_level_where_they_act_and_the_rest_alone():
    # 2.5% spread: all three are small, but only two act at c=64, where their gains can add
    cands = [cand("--graph", "medium", acts=[64]), cand("--mixed", "medium", acts=[8, 64])]
    cands.append(cand("--compile", "low", acts=[1, 8]))
    verdicts = {c["flag"]: APPLIES for c in cands}
    members, why = plan_bundle(cands, verdicts, {})
    assert [c["flag"] for c in members] == ["--graph", "--mixed"] and "below +6.0% at c=64," in why
    assert [c["flag"] for c, _ in next_trials(cands, verdicts, {})] == ["--graph + --mixed", "--compile"]
    # no two act at one level: each alone; a lever whose levels are unknown counts at every level
    apart = [cand("--graph", "medium", acts=[64]), cand("--compile", "low", acts=[1, 8])]
    assert plan_bundle(apart, verdicts, {}) is None
    anywhere = {**cand("--any", "low"), "acts_at_levels": None}
    members, why = plan_bundle([*apart, anywhere], verdicts | {"--any": APPLIES}, {})
    assert [c["flag"] for c in members] == ["--graph", "--any"] and "at c=64," in why


def test_sure_members_of_a_bundle_that_failed_to_start_get_one_trial_each():
    # the real SGLang on the CPU: --max-running-requests 8 rode with --enable-torch-compile, whose
    # CPU graph runner needs an attention backend the deployment does not run; the server exited at
    # start-up and took the big lever down with it
    cands = [cand("--mrr", "high"), cand("--compile", "medium")]
    verdicts = {c["flag"]: {**APPLIES, "flag": c["flag"]} for c in cands}
    failed = {"trial": 1, "kind": "bundle", "decision": "rolled_back", "verdict": None, "failed_start": True}
    tried = {f: [failed] for f in ("--mrr", "--compile")}
    again = next_trials(cands, verdicts, tried)
    assert sorted(c["flag"] for c, _ in again) == ["--compile", "--mrr"]
    assert all("a bundle it was in failed to start" in why for _, why in again)
    # a bundle stopped by the machine (an environment failure) frees no member
    machine = {**failed, "failed_start": False, "environment": "out of disk"}
    assert next_trials(cands, verdicts, {f: [machine] for f in tried}) == []
