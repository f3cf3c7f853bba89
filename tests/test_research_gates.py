"""Caller gates and idle work (tools.research.gates) on a small SGLang-shaped tree: a running reader whose
every caller is guarded off here (`if world_size <= 1: return False` before the call), or whose
branch only calls functions that return early here, is off; one rank is a topology fact."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.sglang_src import synthetic_tree
from tools.research.analysis import analyze_flag
from tools.research.index import load_index

FILES = {
    "srt/server_args.py": """
        from dataclasses import dataclass

        @dataclass
        class ServerArgs:
            fuse_backend: str = None
            tp_size: int = 1
            pp_size: int = 1
            dp_size: int = 1
            hook_backend: str = None

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--fuse-backend", default=ServerArgs.fuse_backend)
                parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size)
                parser.add_argument("--pp-size", type=int, default=ServerArgs.pp_size)
                parser.add_argument("--dp-size", type=int, default=ServerArgs.dp_size)
                parser.add_argument("--hook-backend", default=ServerArgs.hook_backend)
        """,
    "srt/layers/fusion.py": """
        from sglang.srt.config import get_args

        def uses_other():
            return get_args().fuse_backend == "other"

        def resolve_backend():
            backend = get_args().fuse_backend
            return backend

        def ensure_workspace():
            if uses_other():
                return False
            world_size, rank = get_group()
            if world_size <= 1:
                return False
            backend = resolve_backend()
            allocate(backend)
            return True

        def pre_init():
            ensure_workspace()
            ensure_workspace()

        def resolve_hook():
            return get_args().hook_backend

        def run_hook():
            return resolve_hook()

        def install(table):
            table["hook"] = run_hook
        """,
    "srt/runner.py": """
        from sglang.srt.config import get_args
        from sglang.srt.layers.fusion import pre_init, resolve_backend, uses_other

        class Runner:
            def warmup(self):
                if get_args().fuse_backend is None:
                    return
                if uses_other():
                    resolve_backend()
                    return
                pre_init()
        """,
}


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return load_index(synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.8"))


def _facts(tp: int) -> dict[str, object]:
    return {"gpu.sm": 90, "gpu.count": tp, "server.tp_size": tp}


def test_on_one_rank_every_caller_is_gated_off(index) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(index, "--fuse-backend", _facts(1), value="auto")
    assert v.verdict == "no-op", v.summary
    states = {f.location: (f.state, f.why) for f in v.findings}
    state, why = states["sglang/srt/layers/fusion.py:8"]  # resolve_backend's read
    assert state == "off"
    assert "sglang/srt/layers/fusion.py:15" in why and "world_size <= 1" in why and "one rank" in why
    state, why = states["sglang/srt/runner.py:7"]  # the warm-up branch only calls idle work
    assert state == "off" and "sglang/srt/layers/fusion.py:15" in why, why
    assert "gated at sglang/srt/layers/fusion.py:15" in v.summary


def test_on_four_ranks_the_world_size_is_unknown_and_the_flag_applies(index) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(index, "--fuse-backend", _facts(4), value="auto")
    assert v.verdict == "applies", v.summary
    assert all(f.state != "off" or "gated" not in f.why for f in v.findings)


def test_a_function_passed_as_a_callback_has_callers_nobody_sees(index) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(index, "--hook-backend", _facts(1), value="x")
    assert v.verdict == "applies", v.summary
