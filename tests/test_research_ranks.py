"""A flag that sizes the parallel world (`--tp-size`, `--pp-size`, `--dp-size`) on the real 0.5.23
tree: the world size the code reads is the trial's, not the running server's, and more ranks on a
node than it has GPUs cannot start (`tools.research.verdict.decide.ranks_without_gpus`)."""

from __future__ import annotations

import pytest

from tests.research_profiles import profile_facts
from tools.research.analysis import analyze_flag
from tools.research.index import load_index
from tools.research.verdict.decide import Question, ranks_without_gpus

pytestmark = pytest.mark.server


def test_more_ranks_than_the_node_has_gpus_cannot_start(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(load_index(sglang_0523), "--tp-size", profile_facts("llama8b-h100"), value="3")
    assert (v.verdict, v.rule) == ("refuses-to-start", "ranks-without-gpus"), v.summary
    assert "GPU 2" in v.summary and "has 1" in v.summary, v.summary
    assert any(f.location.startswith("sglang/srt/entrypoints/engine.py:") for f in v.findings)


def test_a_larger_world_that_fits_the_node_is_not_a_refusal(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """Four H100s serving at TP 1: TP 2 fits. Read with the running server's one rank, the world
    size check (world_size == tp x pp, distributed/parallel_state.py) looked like it would fail."""
    one_rank = {**profile_facts("h100-llama-tp4"), "server.tp_size": 1}
    v = analyze_flag(load_index(sglang_0523), "--tp-size", one_rank, value="2")
    assert v.verdict == "applies", v.summary
    wide = analyze_flag(load_index(sglang_0523), "--tp-size", one_rank, value="8")
    assert wide.verdict == "refuses-to-start" and "has 4" in wide.summary, wide.summary


def _question(facts: dict, flag_values: dict) -> Question:
    from types import SimpleNamespace

    v = SimpleNamespace(flag="--dp-size", value=flag_values.get("dp_size"), findings=[])
    return Question(v, None, facts=facts, flag_values=flag_values)  # type: ignore[arg-type]


def test_data_parallel_replicas_need_gpus_of_their_own_unless_attention_shares_them() -> None:
    node = {
        "gpu.count": 8, "server.tp_size": 8, "server.pp_size": 1, "server.dp_size": 1, "server.nnodes": 1,
        "server.gpu_id_step": 1, "server.base_gpu_id": 0, "server.enable_dp_attention": False,
    }  # fmt: skip
    assert ranks_without_gpus(_question(node, {"dp_size": 2})) is not None  # 16 GPUs asked
    shared = {**node, "server.enable_dp_attention": True}
    assert ranks_without_gpus(_question(shared, {"dp_size": 2})) is None  # DP attention: the same 8
    two_nodes = {**node, "server.nnodes": 2, "gpu.count": 8}
    assert ranks_without_gpus(_question(two_nodes, {"tp_size": 16})) is None  # 8 a node
    cpu = {**node, "gpu.count": 0, "server.device": "cpu"}
    assert ranks_without_gpus(_question(cpu, {"tp_size": 2})) is None  # a CPU engine's ranks share cores
