"""Planning reads the server's resolved configuration (a real simulated server, the real playbook):
a candidate equal to, or below, what the server already runs is never trialled."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from agent.context import DeploymentContext
from agent.policy.playbook import evaluate, load_playbook
from agent.trial.resolved import drop_pointless, resolved_args
from tools.bench.objective import read_goal
from tools.deploy.health import get_server_info


def _candidates(info: dict, unit_flags: dict) -> dict[str, object]:
    ctx = DeploymentContext(unit_flags=unit_flags, server_info=info, max_concurrency=64)
    facts = {**ctx.facts, "gpu.sm": 90, "gpu.count": 1, "model.is_moe": True}
    cands = drop_pointless(evaluate(load_playbook(), facts), ctx.resolved_args)
    return {c.flag: c for c in cands}


def test_unset_graph_limit_is_read_from_the_resolved_graph_config(sim_server):
    # h200-qwen30b leaves --cuda-graph-max-bs-decode unset: the top level says None, the server captured
    # 256 and says so, as SGLang 0.5.23 does, only in cuda_graph_config.decode.max_bs
    server = sim_server("h200-qwen30b")
    info = asyncio.run(get_server_info(server.endpoint))
    assert info.get("cuda_graph_max_bs_decode") is None
    assert "cuda_graph_max_bs" not in info["internal_states"][0]
    resolved = resolved_args(info)
    assert resolved["cuda_graph_max_bs_decode"] == resolved["cuda_graph_max_bs"] >= 64
    cands = _candidates(info, {})
    graphs = cands.get("--cuda-graph-max-bs-decode") or cands["--cuda-graph-max-bs"]
    assert graphs.status != "candidate", graphs


def test_seed_graph_limit_below_the_load_stays_a_candidate(sim_server):
    server = sim_server("seed")
    info = asyncio.run(get_server_info(server.endpoint))
    cands = _candidates(info, {"--cuda-graph-max-bs-decode": "32"})
    graphs = cands.get("--cuda-graph-max-bs-decode") or cands["--cuda-graph-max-bs"]
    assert graphs.status == "candidate" and graphs.value == "64"


class _Lever:
    needs = ["server.max_running_requests < bench.max_concurrency"]


class _Cand:
    def __init__(self, flag: str, value: str) -> None:
        self.flag, self.value, self.action, self.status, self.lever = (
            flag,
            value,
            "set",
            "candidate",
            _Lever(),
        )


def test_equal_or_lower_limit_is_pointless_and_other_values_are_not():
    from agent.trial.resolved import pointless_reason

    resolved = {"max_running_requests": 128, "attention_backend": "fa3"}
    assert "already resolves" in pointless_reason(_Cand("--max-running-requests", "128"), resolved)
    assert "above 64" in pointless_reason(_Cand("--max-running-requests", "64"), resolved)
    assert pointless_reason(_Cand("--max-running-requests", "256"), resolved) is None
    assert pointless_reason(_Cand("--attention-backend", "FA3"), resolved)
    assert pointless_reason(_Cand("--attention-backend", "triton"), resolved) is None


def test_trial_gate_refuses_a_change_to_the_running_value(sim_server):
    """Whatever the planner (LLM or builtin) asks, a value the server already runs costs no restart."""
    from agent.policy.planner import PlannerDeps, trial
    from agent.policy.verdict import FlagVerdict
    from agent.trial.record import TrialChange

    server = sim_server("seed")  # resolves --chunked-prefill-size to 8192 without the flag set
    info = asyncio.run(get_server_info(server.endpoint))
    recorded: list[tuple] = []
    deps = PlannerDeps(
        goal=read_goal("improve throughput"),
        ctx=DeploymentContext(server_info=info),
        candidates=[],
        # a dry run only prints a line; a refusal is also recorded in the transcript
        ui=SimpleNamespace(note=lambda *a, **k: None, record=lambda *a, **k: recorded.append(a)),
        researcher=None,
        runner=None,
        verdicts={
            "--chunked-prefill-size": FlagVerdict(
                flag="--chunked-prefill-size", verdict="applies", summary="read"
            )
        },
    )
    same = asyncio.run(trial(deps, [TrialChange(flag="--chunked-prefill-size", value="8192")], "r", None))
    assert "already resolves --chunked-prefill-size to 8192" in same["error"]
    assert [kind for kind, *_ in recorded] == ["refusal"] and recorded[0][1]["check"] == "resolved"
    other = asyncio.run(trial(deps, [TrialChange(flag="--chunked-prefill-size", value="16384")], "r", None))
    assert other.get("dry_run")  # allowed through the gate (no runner: a dry run)


def test_the_captured_decode_batch_comes_from_the_graph_config_unless_given_or_disabled():
    """SGLang 0.5.23 folds the decode graph limit into `cuda_graph_config` (cuda_graph_hook.py);
    a flag given on the command line stays what the server runs, and disabled graphs capture none."""
    captured = {"backend": "full", "max_bs": 128}
    info = {"cuda_graph_max_bs_decode": None, "cuda_graph_config": {"decode": captured}}
    assert resolved_args(info)["cuda_graph_max_bs_decode"] == 128
    given = {**info, "cuda_graph_max_bs_decode": 64}
    assert resolved_args(given)["cuda_graph_max_bs_decode"] == 64
    off = {**info, "cuda_graph_config": {"decode": {"backend": "disabled", "max_bs": None}}}
    assert resolved_args(off)["cuda_graph_max_bs_decode"] is None
