"""A guard on an attribute the class sets once, in `__init__`, from a getter of a module global
(`self.use_fast = get_backend().is_fast()`, `def get_backend(): return _BACKEND`): research reads
the attribute as that expression and the getter as what the global's setter stores (`_BACKEND =
Backend(server_args.moe_runner)`), so the guard is decided from the deployment's settings
(`FlagIndex.set_once`, `FlagIndex.stored`). Small SGLang-shaped trees, and the real 0.5.9 wheel."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.sglang_src import synthetic_tree
from tests.research_profiles import research_case
from tools.research.analysis import analyze_flag
from tools.research.index import load_index

SERVER_ARGS = """
    from dataclasses import dataclass

    @dataclass
    class ServerArgs:
        moe_runner: str = "auto"
        moe_precision: str = "default"

        @staticmethod
        def add_cli_args(parser):
            parser.add_argument("--moe-runner", default=ServerArgs.moe_runner)
            parser.add_argument("--moe-precision", default=ServerArgs.moe_precision)
    """
MOE_UTILS = """
    from contextlib import contextmanager
    from enum import Enum

    _BACKEND = None


    class Backend(Enum):
        AUTO = "auto"
        FAST = "fast"
        SLOW = "slow"

        def is_fast(self) -> bool:
            return self == Backend.FAST


    def init_moe(server_args):
        global _BACKEND
        _BACKEND = Backend(server_args.moe_runner)


    def get_backend():
        global _BACKEND
        if _BACKEND is None:
            _BACKEND = Backend.AUTO
        return _BACKEND


    @contextmanager
    def draft_backend():
        global _BACKEND
        saved = _BACKEND
        try:
            _BACKEND = Backend.SLOW
            yield
        finally:
            _BACKEND = saved
    """
METHOD = """
    from sglang.srt.kernels import fast_bf16, fast_default, slow
    from sglang.srt.moe_utils import get_backend


    class Method:
        def __init__(self, server_args):
            self.use_fast = get_backend().is_fast()
            self.moe_precision = server_args.moe_precision

        def apply(self, x):
            if self.use_fast:
                if self.moe_precision == "bf16":
                    return fast_bf16(x)
                return fast_default(x)
            return slow(x)
    """
SCHEDULER = """
    from sglang.srt.method import Method
    from sglang.srt.moe_utils import init_moe


    class Scheduler:
        def __init__(self, server_args):
            init_moe(server_args)
            self.method = Method(server_args)

        def step(self, x):
            return self.method.apply(x)


    def run_scheduler_process(server_args):
        Scheduler(server_args)
    """
KERNELS = """
    def fast_bf16(x):
        return x


    def fast_default(x):
        return x


    def slow(x):
        return x
    """
FILES = {
    "srt/server_args.py": SERVER_ARGS,
    "srt/moe_utils.py": MOE_UTILS,
    "srt/method.py": METHOD,
    "srt/scheduler.py": SCHEDULER,
    "srt/kernels.py": KERNELS,
}


def _index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]):  # type: ignore[no-untyped-def]
    return load_index(synthetic_tree(tmp_path, monkeypatch, files, "9.9.7"))


def _facts(runner: str) -> dict[str, object]:
    return {"gpu.sm": 90, "gpu.count": 1, "server.tp_size": 1, "server.moe_runner": runner}


def test_a_reader_behind_an_attribute_set_once_from_a_getter_is_decided(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    index = _index(tmp_path, monkeypatch, FILES)
    off = analyze_flag(index, "--moe-precision", _facts("slow"), value="bf16")
    assert off.verdict == "no-op", off.summary
    assert "method.py:13: self.use_fast" in off.summary and "server.moe_runner = 'slow'" in off.summary, (
        off.summary
    )
    on = analyze_flag(index, "--moe-precision", _facts("fast"), value="bf16")
    assert on.verdict == "applies", on.summary
    assert (on.rule, on.basis) == ("reader-runs", "guard"), on.summary  # settled, not left open


def test_an_attribute_set_again_elsewhere_is_not_read_as_its_first_value(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # another method sets the attribute again: what it holds when apply runs is not known
    again = METHOD.replace(
        "    def apply(self, x):",
        "    def use_slow(self):\n            self.use_fast = False\n\n        def apply(self, x):",
    )
    index = _index(tmp_path, monkeypatch, {**FILES, "srt/method.py": again})
    v = analyze_flag(index, "--moe-precision", _facts("slow"), value="bf16")
    assert v.verdict != "no-op" and v.basis == "open" and "runtime state" in v.summary, v.summary


def test_a_second_setter_of_the_global_leaves_the_getter_open(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a function that stores another backend for good (not one it puts back) makes two stores
    utils = (
        MOE_UTILS
        + """

    def force_slow():
        global _BACKEND
        _BACKEND = Backend.SLOW
    """
    )
    index = _index(tmp_path, monkeypatch, {**FILES, "srt/moe_utils.py": utils})
    v = analyze_flag(index, "--moe-precision", _facts("fast"), value="bf16")
    assert v.verdict != "no-op", v.summary
    assert analyze_flag(index, "--moe-precision", _facts("slow"), value="bf16").verdict != "no-op"


def test_mxfp4_precision_is_no_op_where_the_moe_runner_is_not_flashinfer_on_the_real_059_tree(
    sglang_059,
) -> None:  # type: ignore[no-untyped-def]
    """0.5.9: `Mxfp4MoEMethod.__init__` sets `self.use_flashinfer = get_moe_runner_backend()
    .is_flashinfer_mxfp4()` (mxfp4.py:303); `apply` reads the precision only under it (:754). On
    an H200 gpt-oss runs triton_kernel (SGLang's start-up picks it), so the precision is never read."""
    v = research_case(sglang_059, "t3-gptoss120b-h200", "--flashinfer-mxfp4-moe-precision", "bf16")
    assert v.verdict == "no-op", v.summary
    assert "mxfp4.py:754" in v.summary and "moe_runner_backend" in v.summary, v.summary
