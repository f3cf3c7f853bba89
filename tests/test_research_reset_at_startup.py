"""A flag SGLang's own resolution sets back (`if self.dp_size == 1: self.enable_dp_attention =
False`) after argument code already read it to change another setting: code that runs after
start-up reads the value it reads without the flag, so a refusal it would reach with the trial
value does not fire; the other setting it changed decides (`analysis._reset_at_startup`). A small
SGLang-shaped tree, and the real 0.5.9 wheel."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.sglang_src import synthetic_tree
from tests.research_profiles import research_case
from tools.research.analysis import analyze_flag
from tools.research.index import load_index
from tools.research.startup.check import StartupAnswer

SERVER_ARGS = """
    from dataclasses import dataclass

    @dataclass
    class ServerArgs:
        dp_size: int = 1
        enable_dp_attn: bool = False
        mem_fraction: float = 0.9

        def __post_init__(self):
            if self.enable_dp_attn:
                self.mem_fraction = self.mem_fraction - 0.05
            if self.dp_size == 1:
                self.enable_dp_attn = False

        @staticmethod
        def add_cli_args(parser):
            parser.add_argument("--dp-size", type=int, default=ServerArgs.dp_size)
            parser.add_argument("--enable-dp-attn", action="store_true")
            parser.add_argument("--mem-fraction", type=float, default=ServerArgs.mem_fraction)
    """
WORKER = """
    class Worker:
        def __init__(self, server_args):
            self.pool = server_args.mem_fraction * 100
            if server_args.enable_dp_attn:
                assert server_args.dp_size > 1, "dp_size must be greater than 1"


    def run_scheduler_process(server_args):
        Worker(server_args)
    """
FILES = {"srt/server_args.py": SERVER_ARGS, "srt/worker.py": WORKER}
FACTS = {"gpu.sm": 90, "gpu.count": 1, "server.tp_size": 1, "server.dp_size": 1}
BASELINE = {"dp_size": 1, "enable_dp_attn": False, "mem_fraction": 0.9}


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return load_index(synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.8"))


def test_a_refusal_under_a_flag_start_up_sets_back_does_not_fire(index) -> None:  # type: ignore[no-untyped-def]
    startup = StartupAnswer(kind="changed", changed={"mem_fraction": (0.9, 0.85)}, baseline=BASELINE)
    v = analyze_flag(index, "--enable-dp-attn", FACTS, startup=startup)
    assert v.verdict == "applies", v.summary  # it lowered the memory fraction on its way
    [worker] = [f for f in v.findings if f.location.endswith("worker.py:5")]
    assert worker.state == "off" and not worker.exits, (worker.state, worker.exits)
    assert "leaves `enable_dp_attn` at False" in worker.why, worker.why


def test_where_start_up_keeps_the_value_the_refusal_still_fires(index) -> None:  # type: ignore[no-untyped-def]
    """Had SGLang's resolution kept the flag on, the worker's assert would stop the server."""
    kept = {"mem_fraction": (0.9, 0.85), "enable_dp_attn": (False, True)}
    startup = StartupAnswer(kind="changed", changed=kept, baseline=BASELINE)
    v = analyze_flag(index, "--enable-dp-attn", FACTS, startup=startup)
    assert v.verdict == "refuses-to-start", v.summary
    assert "dp_size must be greater than 1" in v.summary, v.summary


def test_dp_attention_with_one_dp_rank_on_the_real_059_tree(sglang_059) -> None:  # type: ignore[no-untyped-def]
    """0.5.9, DeepSeek-V3 on 8 x B200, dp_size 1: `_handle_data_parallelism` sets
    `enable_dp_attention` back to False (server_args.py:2111) after the memory heuristic and the
    all-reduce fusion default read it; `require_mlp_tp_gather`'s `assert dp_size > 1`
    (utils/common.py:3101) never sees it on."""
    v = research_case(sglang_059, "t4-deepseekv3-b200x8", "--enable-dp-attention")
    assert v.verdict == "applies", v.summary
    assert not any("dp_size must be greater than 1" in e.message for f in v.findings for e in f.exits)
    assert any("mem_fraction_static" in f.why for f in v.findings if f.state == "on"), v.summary
