"""A method call resolved by its receiver (`tools.research.flag_index.lookup.FlagIndex.call_sites`),
on a small SGLang-shaped tree: `cls.get_fn()` in a class that defines `get_fn` calls its own, not
another class's method of that name, so it does not keep that other method running where the only
code that uses it is not built (0.5.9's `CommunicateSummableTensorPairFn.execute` and
`CommunicateWithAllReduceAndLayerNormFn.get_fn`, which made FlashInfer all-reduce fusion look
used by a Mixtral that builds no `LayerCommunicator`). A subclass's override stays reachable."""

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
            fusion_flag: bool = False
            tp_size: int = 1

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--fusion-flag", action="store_true")
                parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size)
        """,
    "srt/comm.py": """
        from sglang.srt.config import get_args

        def fused_enabled(n):
            return n > 0 and get_args().fusion_flag

        class Layer:
            def __init__(self):
                self.fn = FusedFn.get_fn()

        class FusedFn:
            @staticmethod
            def get_fn():
                return FusedFn._gather

            @staticmethod
            def _gather(x):
                if fused_enabled(x):
                    return fuse(x)
                return x

        class SumFn:
            @classmethod
            def execute(cls, x):
                return cls.get_fn()(x)

            @staticmethod
            def get_fn():
                return SumFn._plain

        def build():
            if get_args().tp_size > 1:
                return Layer()
            return None
        """,
}


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return load_index(synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.8"))


def _facts(tp: int) -> dict[str, object]:
    return {"gpu.sm": 90, "gpu.count": tp, "server.tp_size": tp}


def test_a_classmethod_calling_its_own_get_fn_does_not_keep_another_classes_running(index) -> None:  # type: ignore[no-untyped-def]
    get_fn = index.func("sglang/srt/comm.py", "FusedFn.get_fn")
    callers = {c.qual for c, _ in index.call_sites(get_fn, uses=True)}
    assert callers == {"Layer.__init__"}, callers
    one_gpu = analyze_flag(index, "--fusion-flag", _facts(1))
    assert one_gpu.verdict == "no-op", one_gpu.summary
    assert "build calls Layer() only when get_args().tp_size > 1" in one_gpu.summary, one_gpu.summary
    assert analyze_flag(index, "--fusion-flag", _facts(4)).verdict == "applies"


def test_an_override_a_subclass_instance_runs_is_still_called_through_self(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    files = {
        **FILES,
        "srt/kids.py": """
            class Base:
                def run(self):
                    return self.step()

                def step(self):
                    return 0

            class Kid(Base):
                def step(self):
                    return 1
            """,
    }
    index = load_index(synthetic_tree(tmp_path, monkeypatch, files, "9.9.9"))
    step = index.func("sglang/srt/kids.py", "Kid.step")
    assert {c.qual for c, _ in index.call_sites(step, uses=True)} == {"Base.run"}
    base_step = index.func("sglang/srt/kids.py", "Base.step")
    assert {c.qual for c, _ in index.call_sites(base_step, uses=True)} == {"Base.run"}
