"""World size from a helper's return value (issue 53, item 3): a guard such as
`get_moe_expert_parallel_world_size() > 1` is decided from the deployment's sizes by following the
helper's `return` through the index into the parallel state (a group held as `<dim>_group` is as
wide as `<dim>_size`; a width declared with the function computing it is that function on the
server args), on a small SGLang-shaped tree and on the real 0.5.23 wheel. Before, only a few
names of world-size helpers were known, and on more than one rank every size but the TP size was
left open."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.sglang_src import synthetic_tree
from tests.research_profiles import profile_facts
from tools.research.analysis import analyze_flag
from tools.research.callers import env_of
from tools.research.facts import default_facts, deployment_facts
from tools.research.guard_eval import evaluate
from tools.research.index import load_index

FILES = {
    "srt/server_args.py": """
        from dataclasses import dataclass

        @dataclass
        class ServerArgs:
            a2a_chunk: int = 0
            tp_size: int = 1
            pp_size: int = 1
            dp_size: int = 1
            ep_size: int = 1

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--a2a-chunk", type=int, default=ServerArgs.a2a_chunk)
                parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size)
                parser.add_argument("--pp-size", type=int, default=ServerArgs.pp_size)
                parser.add_argument("--dp-size", type=int, default=ServerArgs.dp_size)
                parser.add_argument("--ep-size", type=int, default=ServerArgs.ep_size)
        """,
    "srt/fields.py": """
        class Derived:
            def __init__(self, fn="", doc=""):
                self.fn = fn

        class Parallel:
            moe_ep_size = Derived(fn="sglang.srt.widths.moe_ep_size_of", doc="expert-parallel width")
        """,
    "srt/widths.py": """
        def derive_widths(*, tp_size, ep_size):
            return {"moe_ep_size": ep_size, "moe_tp_size": tp_size // ep_size}

        def widths_of(cfg):
            return derive_widths(tp_size=cfg.tp_size, ep_size=cfg.ep_size)

        def moe_ep_size_of(cfg):
            return widths_of(cfg)["moe_ep_size"]
        """,
    "srt/distributed/parallel_state.py": """
        _PARALLEL = None

        def get_parallel():
            return _PARALLEL

        def get_moe_ep_group():
            assert _PARALLEL is not None, "expert parallel group is not initialized"
            return get_parallel().moe_ep_group

        def get_moe_expert_parallel_world_size():
            \"\"\"Return world size for the moe expert parallel group.\"\"\"
            return get_moe_ep_group().world_size
        """,
    "srt/layers/moe/a2a.py": """
        from sglang.srt.distributed.parallel_state import get_moe_expert_parallel_world_size

        class A2ADispatcher:
            def __init__(self, server_args):
                if get_moe_expert_parallel_world_size() > 1:
                    self.chunk = server_args.a2a_chunk
        """,
}


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return load_index(synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.54"))


def test_an_expert_parallel_guard_is_decided_through_the_helpers_return(index) -> None:  # type: ignore[no-untyped-def]
    """`get_moe_expert_parallel_world_size()` returns `get_moe_ep_group().world_size`; the group
    helper (an assert, then its return) gives `get_parallel().moe_ep_group`, as wide as
    `moe_ep_size`, which `Parallel` declares computed by `moe_ep_size_of(cfg)`: the dict entry
    `derive_widths` returns, `ep_size`. On TP 4 without EP the reader is gated off; with EP 4 it runs."""
    facts = {"gpu.sm": 90, "gpu.count": 4, "server.tp_size": 4, "model.architecture": "Qwen3MoeForCausalLM"}
    off = analyze_flag(index, "--a2a-chunk", facts, value="8")
    assert off.verdict == "no-op", off.summary
    assert "server.ep_size = 1" in off.summary, off.summary
    on = analyze_flag(index, "--a2a-chunk", {**facts, "server.ep_size": 4}, value="8")
    assert on.verdict == "applies", on.summary


def _evaluate(tree, profile: str, path: str, qual: str, guard: str):  # type: ignore[no-untyped-def]
    index = load_index(tree)
    facts = deployment_facts(index, profile_facts(profile), None, default_facts(index.catalog))
    return evaluate(guard, env_of(index, index.func(path, qual), facts, {}, {}))


def test_world_size_helpers_follow_into_the_parallel_state_in_0523(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """0.5.23 on TP 4 (the story): `get_pp_group()` returns `get_parallel().pp_group`
    (parallel_state.py:2281-2282), built `pp_size` wide (:2632, 2952-2960), so
    `get_pp_group().world_size == 1` holds; `get_moe_expert_parallel_world_size()` returns
    `get_moe_ep_group().world_size` (:3245-3247), the group `moe_ep_size` wide, a width
    `Parallel` declares computed by `moe_ep_size_of` (arg_groups/fields/parallel.py:339-342;
    runtime_context.py:215-217, 141-158: `ep_size`): 1. `attn_tp_size`, set from
    `parallel.attn_tp_size` in `dp_reduce_scatterv_async` (dp_attention.py:1252), is
    `tp_size // attn_dp_size // attn_cp_size` (runtime_context.py:73-76): 4, not 1."""
    where = ("sglang/srt/layers/dp_attention.py", "dp_reduce_scatterv_async")
    pp = _evaluate(sglang_0523, "story", *where, "get_pp_group().world_size == 1")
    assert pp.value is True, (pp.used, pp.runtime)
    ep = _evaluate(sglang_0523, "story", *where, "get_moe_expert_parallel_world_size() > 1")
    assert ep.value is False, (ep.used, ep.runtime)
    assert "server.ep_size = 1" in ep.used
    attn = _evaluate(sglang_0523, "story", *where, "attn_tp_size == 1")
    assert attn.value is False, (attn.used, attn.runtime)
