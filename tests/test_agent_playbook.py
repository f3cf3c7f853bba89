"""The playbook and its condition language, checked against facts of different deployments."""

from __future__ import annotations

import pytest

from agent.policy.conditions import ConditionError, check
from agent.policy.loadstate import LoadState, costs_at
from agent.policy.playbook import evaluate, load_playbook

SEED = {
    "bench.max_concurrency": 64,
    "model.is_moe": True,
    "model.attention_kinds_has_linear": True,
    "model.experts_per_tok": 8,
    "server.tp_size": 4,
    "server.moe_runner_backend": "auto",
    "server.attention_backend": "triton",
    "server.max_running_requests": 64,
    "server.mem_fraction_static": 0.85,
    "flag.cuda_graph_max_bs_decode": 32,
    "flag.max_running_requests": 64,
    "gpu.sm": 120,
}
DENSE_H100 = {
    "bench.max_concurrency": 64,
    "model.is_moe": False,
    "model.experts_per_tok": 0,
    "server.tp_size": 1,
    "server.max_running_requests": 48,
    "flag.max_running_requests": 48,
    "gpu.sm": 90,
}


def test_conditions_pass_fail_unknown_and_reject_code():
    assert check("model.experts_per_tok > 2", SEED).outcome == "pass"
    assert check("model.experts_per_tok > 2", DENSE_H100).outcome == "fail"
    assert check("model.num_experts > 2", SEED).outcome == "unknown"
    assert check("not model.is_moe", SEED).outcome == "fail"
    assert check("gpu.sm not in [90, 100]", SEED).outcome == "pass"
    assert check("server.moe_runner_backend in ['auto', 'triton', None]", SEED).outcome == "pass"
    with pytest.raises(ConditionError):
        check("__import__('os').system('true')", SEED)


def test_playbook_has_the_required_levers():
    flags = {lv.flag for lv in load_playbook()}
    for required in (
        "--enable-fused-moe-sum-all-reduce",
        "--enable-flashinfer-allreduce-fusion",
        "--cuda-graph-max-bs",
        "--max-running-requests",
        "--mem-fraction-static",
        "--chunked-prefill-size",
        "--enable-torch-compile",
        "--kv-cache-dtype",
        "--schedule-conservativeness",
        "--speculative-num-draft-tokens",
        "--triton-attention-reduce-in-fp32",
        "--num-continuous-decode-steps",
        "--enable-mixed-chunk",
        "--disable-radix-cache",
        "--schedule-policy",
        "--stream-interval",
    ):
        assert required in flags
    assert next(lv for lv in load_playbook() if lv.flag == "--kv-cache-dtype").lossy


def _by_flag(facts):
    return {c.lever.flag: c for c in evaluate(load_playbook(), facts)}


def test_same_playbook_different_conclusions_per_deployment():
    seed, dense = _by_flag(SEED), _by_flag(DENSE_H100)
    assert seed["--enable-fused-moe-sum-all-reduce"].status == "candidate"
    assert dense["--enable-fused-moe-sum-all-reduce"].status == "no-op"
    assert seed["--enable-flashinfer-allreduce-fusion"].status == "incompatible"  # SM120
    assert dense["--enable-flashinfer-allreduce-fusion"].status == "no-op"  # TP 1
    assert seed["--enable-torch-compile"].status == "incompatible"  # linear attention hangs compiled
    assert dense["--enable-torch-compile"].status == "candidate"
    assert seed["--max-running-requests"].status == "already-set"
    assert dense["--max-running-requests"].status == "candidate"
    assert dense["--max-running-requests"].value == "64"
    assert seed["--cuda-graph-max-bs"].value == "64"


def test_a_cpu_engine_gets_its_own_levers_and_shared_prefixes_the_queue_order():
    gpu = dict(DENSE_H100, **{"server.device": "cuda", "server.stream_interval": 1})
    cpu = dict(gpu, **{"server.device": "cpu", "gpu.count": 0})
    assert _by_flag(cpu)["--stream-interval"].status == "candidate"
    assert _by_flag(cpu)["--stream-interval"].value == "8"
    assert _by_flag(gpu)["--stream-interval"].status == "already-set"  # pointless on a GPU host
    fcfs = dict(gpu, **{"server.schedule_policy": "fcfs", "server.disable_radix_cache": False})
    assert _by_flag(dict(fcfs, **{"bench.prefix_share": 0.5}))["--schedule-policy"].status == "candidate"
    assert _by_flag(dict(fcfs, **{"bench.prefix_share": 0}))["--schedule-policy"].status == "already-set"
    no_cache = dict(fcfs, **{"bench.prefix_share": 0.5, "server.disable_radix_cache": True})
    assert _by_flag(no_cache)["--schedule-policy"].status == "no-op"
    # a burstier stream is paid at every measured level: it never rides in a bundle on a partner's gain
    state = LoadState(levels={c: {"concurrency": c, "running": 1.0, "queued": 0} for c in (1, 8)})
    assert costs_at(_by_flag(cpu)["--stream-interval"].lever, state) == [1, 8]
    assert costs_at(_by_flag(cpu)["--schedule-policy"].lever, state) == []


def test_deprecated_flag_is_replaced_from_the_catalog():
    class Entry:
        deprecated = True

    catalog = {
        "--enable-flashinfer-allreduce-fusion": Entry(),
        "--flashinfer-allreduce-fusion-backend": object(),
    }
    h200 = dict(SEED, **{"gpu.sm": 90})
    cand = next(
        c
        for c in evaluate(load_playbook(), h200, catalog)
        if c.lever.flag == "--enable-flashinfer-allreduce-fusion"
    )
    assert (cand.flag, cand.value, cand.status) == (
        "--flashinfer-allreduce-fusion-backend",
        "auto",
        "candidate",
    )
    gone = [c for c in evaluate(load_playbook(), h200, catalog) if c.lever.flag == "--disable-radix-cache"]
    assert gone[0].status == "not-in-version"
