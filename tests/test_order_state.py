"""The order of trials from the deployment's own state (agent/policy/loadstate.py): what the
baseline shows at each level raises or lowers a lever's expected value beside the playbook's
priority, and says where its mechanism acts."""

from __future__ import annotations

from agent.policy.loadstate import load_state, state_factor
from agent.policy.order import expected_value
from agent.policy.playbook import load_playbook
from agent.policy.trialqueue import next_trials
from tools.bench.results import LevelResult, SweepResult
from tools.config import BenchConfig

BENCH = BenchConfig(concurrency=[1, 8, 64], input_len=1024, output_len=128)
SEED = {  # the seed's resolved server (agent/context facts): graphs to 32, 64 running, a large KV pool
    "server.max_running_requests": 64, "server.max_total_num_tokens": 1045235,
    "server.cuda_graph_max_bs_decode": 32, "server.cuda_graph_max_bs": 32,
}  # fmt: skip


def sweeps(tpot_ms: dict[int, float], tok_s: dict[int, float]) -> list[SweepResult]:
    levels = [
        LevelResult(
            max_concurrency=c, num_prompts=8, completed=8, output_throughput=tok_s[c], mean_tpot_ms=tpot_ms[c]
        )
        for c in tpot_ms
    ]
    return [SweepResult(endpoint="http://x", api="completions", levels=levels)] * 2


# Little's law: 64 streams at 40 ms a token make 1,600 tok/s; 8 at 20 ms, 400; one at 8 ms, 125
BASE = sweeps({1: 8.0, 8: 20.0, 64: 40.0}, {1: 125.0, 8: 400.0, 64: 1600.0})
LEVER = {lv.flag: lv for lv in load_playbook()}


def test_the_running_batch_waiting_requests_kv_use_and_graph_cover_of_each_level():
    state = load_state(SEED, BENCH, BASE)
    assert [state.levels[c]["running"] for c in (1, 8, 64)] == [1.0, 8.0, 64.0]
    assert [state.levels[c]["captured"] for c in (1, 8, 64)] == [True, True, False]
    assert state.levels[64]["queued"] == 0 and abs(state.levels[64]["kv_use"] - 64 * 1152 / 1045235) < 1e-3
    assert state.facts["state.uncaptured_share"] == 0.5 and state.facts["state.uncaptured_levels"] == 1
    assert "c=64: running batch ~64 (beyond the captured 32)" in state.describe()
    # a cap of 48 running requests: 16 wait at c=64, the batch is 48
    capped = load_state({**SEED, "server.max_running_requests": 48}, BENCH, BASE)
    assert capped.levels[64]["running"] == 48.0 and capped.levels[64]["queued"] == 16


def test_the_baseline_raises_the_graph_lever_where_batches_run_eager_and_lowers_it_where_all_are_captured():
    eager = load_state(SEED, BENCH, BASE)
    factor, why = state_factor(LEVER["--cuda-graph-max-bs"], eager)
    assert factor == 1.5 and why == ["raised: state.uncaptured_share >= 0.25 (here 0.5)"]
    covered = load_state({**SEED, "server.cuda_graph_max_bs_decode": 256}, BENCH, BASE)
    factor, why = state_factor(LEVER["--cuda-graph-max-bs"], covered)
    assert factor == 0.5 * 0.25 and "no measured level where not level.captured" in why[-1]


def test_levers_for_a_full_kv_pool_or_a_queue_lose_value_where_neither_shows():
    state = load_state(SEED, BENCH, BASE)
    assert state_factor(LEVER["--mem-fraction-static"], state)[0] == 0.5 * 0.25  # KV 7% used at c=64
    assert state_factor(LEVER["--max-running-requests"], state)[0] == 0.25  # nothing waits
    full = load_state(
        {**SEED, "server.max_total_num_tokens": 60000, "server.max_running_requests": 48}, BENCH, BASE
    )
    assert state_factor(LEVER["--mem-fraction-static"], full)[0] == 1.5  # 48 x 1152 = 92% of the pool
    assert state_factor(LEVER["--max-running-requests"], full)[0] == 1.5  # 16 wait


def test_the_state_changes_the_order_beside_the_priority():
    # a medium lever raised by the state goes before a high one the state lowers
    cands = [
        {"flag": "--high", "priority": "high", "status": "candidate", "state_factor": 0.25},
        {"flag": "--medium", "priority": "medium", "status": "candidate", "state_factor": 1.5},
    ]
    verdicts = {c["flag"]: {"verdict": "applies"} for c in cands}
    assert [c["flag"] for c, _ in next_trials(cands, verdicts, {})] == ["--medium", "--high"]
    assert expected_value(cands[1], verdicts["--medium"]) == 0.8 * 0.04 * 1.5


def test_no_baseline_state_leaves_the_playbook_priority_alone():
    empty = load_state(SEED, BENCH, [])
    assert state_factor(LEVER["--cuda-graph-max-bs"], empty) == (1.0, [])


def test_the_report_says_what_the_load_made_of_each_candidate():
    from types import SimpleNamespace

    from agent.policy.playbook import evaluate
    from agent.session import _order_notes
    from tools.bench.objective import read_goal

    facts = {**SEED, "bench.max_concurrency": 64, "bench.kv_tokens_needed": 73728,
             "flag.cuda_graph_max_bs_decode": 32, "server.chunked_prefill_size": 8192}  # fmt: skip
    deps = SimpleNamespace(
        candidates=evaluate(load_playbook(), facts), state=load_state(SEED, BENCH, BASE), runner=None,
        spread=None, allow_lossy=False, goal=read_goal("improve throughput"),
    )  # fmt: skip
    [line] = _order_notes(deps)
    assert line.startswith("order from the load: --cuda-graph-max-bs x1.5 (raised: state.uncaptured_share")
    assert "--enable-mixed-chunk x1.5" in line and "--kv-cache-dtype x0.25" in line


def test_a_goal_on_one_level_lowers_the_levers_that_act_only_elsewhere():
    from types import SimpleNamespace

    from agent.policy.planner import goal_levels
    from tools.bench.objective import read_goal

    state = load_state(SEED, BENCH, BASE)  # running batch 1 / 8 / 64
    for goal, judged in [
        ("lower latency", [1]),
        ("p99 ttft at concurrency 64", [64]),
        ("improve throughput", None),
    ]:
        assert goal_levels(SimpleNamespace(goal=read_goal(goal), state=state)) == judged
    mixed = LEVER["--enable-mixed-chunk"]  # acts where 8 or more run: c=8 and c=64
    assert state_factor(mixed, state, [64]) == state_factor(mixed, state)  # it acts where the goal looks
    factor, why = state_factor(mixed, state, [1])
    assert factor == state_factor(mixed, state)[0] * 0.25
    assert why[-1] == "lowered: it acts at c=8, c=64; the goal judges c=1"
    compile_ = LEVER["--enable-torch-compile"]  # acts where 32 or fewer run: c=1 and c=8
    assert state_factor(compile_, state, [1]) == state_factor(compile_, state)
