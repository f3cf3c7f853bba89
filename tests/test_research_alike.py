"""A flag's value that acts only through tests answering alike with it and without it
(`tools.research.follow.alike`), on a small SGLang-shaped tree and on the real 0.5.23 and 0.5.15.post1
wheels: the local holding the value, the enum member built from it, and the module global the
member is stored in, whose getter's callers only ask predicates of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.sglang_src import synthetic_tree
from tests.research_profiles import profile_facts, research_case
from tools.research.analysis import analyze_flag
from tools.research.index import load_index

FILES = {
    "srt/server_args.py": """
        from dataclasses import dataclass

        @dataclass
        class ServerArgs:
            gemm_backend: str = "auto"
            attn_mode: str = "auto"
            tp_size: int = 1

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--gemm-backend", default=ServerArgs.gemm_backend)
                parser.add_argument("--attn-mode", default=ServerArgs.attn_mode)
                parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size)
        """,
    "srt/gemm.py": """
        from enum import Enum

        from sglang.srt.config import get_args
        from sglang.srt.utils import is_sm100_supported

        _BACKEND = None
        _MODE = None


        class GemmBackend(Enum):
            AUTO = "auto"
            CUTEDSL = "cutedsl"
            GEMV = "gemv"
            TORCH = "torch"

            def is_cutedsl(self) -> bool:
                return self == GemmBackend.CUTEDSL

            def is_gemv(self) -> bool:
                return self == GemmBackend.GEMV

            def is_auto(self) -> bool:
                return self == GemmBackend.AUTO


        class AttnMode(Enum):
            AUTO = "auto"
            FAST = "fast"

            def is_auto(self) -> bool:
                return self == AttnMode.AUTO


        def init_gemm():
            global _BACKEND
            backend_str = get_args().gemm_backend
            if backend_str == "auto" and is_sm100_supported():
                backend_str = "cutedsl"
            backend = GemmBackend(backend_str)
            if backend.is_cutedsl():
                if not is_sm100_supported():
                    raise ValueError(f"{backend.value} needs SM100")
            _BACKEND = backend


        def get_gemm_backend():
            global _BACKEND
            if _BACKEND is None:
                _BACKEND = GemmBackend.AUTO
            return _BACKEND


        def init_attn():
            global _MODE
            mode = get_args().attn_mode
            _MODE = AttnMode(mode)


        def get_attn_mode():
            return _MODE
        """,
    "srt/linear.py": """
        from sglang.srt.gemm import get_attn_mode, get_gemm_backend, init_attn, init_gemm


        def start():
            init_gemm()
            init_attn()


        class Linear:
            def forward(self, x):
                if get_gemm_backend().is_cutedsl() or get_gemm_backend().is_gemv():
                    return x * 2
                if get_attn_mode().is_auto():
                    return x * 3
                return x


        LAYER = Linear()
        """,
}


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return load_index(synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.7"))


def _facts(sm: int) -> dict[str, object]:
    return {"gpu.sm": sm, "gpu.count": 1, "server.tp_size": 1}


def test_a_value_every_test_answers_alike_is_a_no_op(index) -> None:  # type: ignore[no-untyped-def]
    # off SM100, `torch` and the default `auto` answer every test the code makes alike: no
    # `is_auto()` of the backend is asked anywhere
    v = analyze_flag(index, "--gemm-backend", _facts(90), value="torch")
    assert (v.verdict, v.basis) == ("no-op", "alike"), v.summary
    assert "is_cutedsl()" in v.summary and "GemmBackend.TORCH and GemmBackend.AUTO" in v.summary
    # a value that some test tells apart acts: gemv takes the other branch of `forward`
    assert analyze_flag(index, "--gemm-backend", _facts(90), value="gemv").verdict == "applies"
    # and cutedsl refuses off SM100 (the raise's message formats the member: under a test that
    # fails with either value, not a use of it)
    assert analyze_flag(index, "--gemm-backend", _facts(90), value="cutedsl").verdict == "refuses-to-start"
    # on SM100 the default becomes cutedsl: torch is no longer alike
    assert analyze_flag(index, "--gemm-backend", _facts(100), value="torch").verdict == "applies"


def test_a_member_whose_getter_is_asked_what_tells_it_apart_acts(index) -> None:  # type: ignore[no-untyped-def]
    # `get_attn_mode().is_auto()` tells fast from the default auto
    v = analyze_flag(index, "--attn-mode", _facts(90), value="fast")
    assert v.verdict == "applies" and v.basis != "alike", v.summary


def test_torch_bf16_gemm_is_the_default_off_blackwell_on_the_real_0523_tree(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """0.5.23's `initialize_bf16_gemm_config` (unquant.py:298-375): `auto` becomes cutedsl on SM100
    only; elsewhere the backend is asked only `is_gemv()`/`is_cutedsl()` (here, in
    `UnquantizedLinearMethod.apply` and in Kimi-K3), which torch and auto answer alike."""
    verdicts = {
        value: research_case(sglang_0523, "t3-qwen3-30b-a3b-rtx6000", "--bf16-gemm-backend", value)
        for value in ("torch", "gemv")
    }
    assert (verdicts["torch"].verdict, verdicts["torch"].basis) == ("no-op", "alike"), verdicts[
        "torch"
    ].summary
    assert verdicts["gemv"].verdict != "no-op", verdicts["gemv"].summary


def test_a_getter_whose_only_running_caller_asks_one_predicate_on_the_real_01515_tree(sglang_0515) -> None:  # type: ignore[no-untyped-def]
    """0.5.15.post1's `initialize_fp8_gemm_config` stores the FP8 GEMM backend's member; on an
    unquantized Mixtral the FP8 methods reading it back are not built, and the flashinfer autotune
    probe asks only `is_flashinfer_cutlass()`, which triton and auto answer alike."""
    index = load_index(sglang_0515)
    v = research_case(sglang_0515, "mixtral-a100x2", "--fp8-gemm-backend", "triton")
    assert (v.verdict, v.basis) == ("no-op", "alike"), v.summary
    assert "is_flashinfer_cutlass()" in v.summary
    # `backend = Fp8GemmRunnerBackend(backend)` (fp8_utils.py:550): the value it held goes in its place
    from tools.research.guards.terms import Env
    from tools.research.reach import value_at

    func = index.func("sglang/srt/layers/quantization/fp8_utils.py", "initialize_fp8_gemm_config")
    env = Env(
        profile_facts("mixtral-a100x2"), {"fp8_gemm_runner_backend": "triton"}, frozenset(), dict(func.locals)
    )
    assert value_at(func, "backend", 560, env) == "Fp8GemmRunnerBackend(server_args.fp8_gemm_runner_backend)"
