"""A flag's value stored in a module global and handed out by a getter (`_RUNNER = Runner(backend)`;
`def get_runner(): return _RUNNER`), on a small SGLang-shaped tree and on the real 0.5.9 wheel:
each caller keeping the getter's value in a local is a reader of the flag, its refusals reached
with that local holding the stored value in the flag's terms (`stores.through_getter`); when no
caller runs here, the store is off."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.sglang_src import synthetic_tree
from tests.research_profiles import research_case
from tools.research.analysis import analyze_flag
from tools.research.index import load_index

FILES = {
    "srt/server_args.py": """
        from dataclasses import dataclass

        @dataclass
        class ServerArgs:
            gemm_runner: str = "auto"
            quantization: str = None
            tp_size: int = 1

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--gemm-runner", default=ServerArgs.gemm_runner)
                parser.add_argument("--quantization", default=ServerArgs.quantization)
                parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size)
        """,
    "srt/gemm.py": """
        from enum import Enum

        from sglang.srt.utils import is_blackwell, use_env_runner

        _RUNNER = None


        class Runner(Enum):
            AUTO = "auto"
            TRTLLM = "trtllm"
            TRITON = "triton"

            def is_auto(self) -> bool:
                return self == Runner.AUTO

            def is_trtllm(self) -> bool:
                return self == Runner.TRTLLM


        def init_runner(server_args):
            global _RUNNER
            backend = server_args.gemm_runner
            if backend == "auto":
                if use_env_runner():
                    backend = "trtllm"
            _RUNNER = Runner(backend)


        def get_runner():
            global _RUNNER
            if _RUNNER is None:
                _RUNNER = Runner.AUTO
            return _RUNNER


        def pick():
            backend = get_runner()
            if not backend.is_auto():
                return _explicit(backend)
            return None


        def _explicit(backend):
            if backend.is_trtllm():
                if not is_blackwell():
                    raise RuntimeError("the trtllm runner needs Blackwell")
            return backend
        """,
    "srt/layers.py": """
        from sglang.srt.gemm import pick


        class QuantLinear:
            def __init__(self):
                self.kernel = pick()


        def build(server_args):
            if server_args.quantization == "fp8":
                return QuantLinear()
            return None
        """,
    "srt/scheduler.py": """
        from sglang.srt.gemm import init_runner
        from sglang.srt.layers import build


        class Scheduler:
            def __init__(self, server_args):
                init_runner(server_args)
                self.layer = build(server_args)


        def run_scheduler_process(server_args):
            Scheduler(server_args)
        """,
}


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return load_index(synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.6"))


def _facts(sm: int, quantization: str | None) -> dict[str, object]:
    return {"gpu.sm": sm, "gpu.count": 1, "server.tp_size": 1, "server.quantization": quantization}


def test_a_refusal_behind_the_getter_of_the_stored_value_fires(index) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(index, "--gemm-runner", _facts(90, "fp8"), value="trtllm")
    assert v.verdict == "refuses-to-start", v.summary
    assert "the trtllm runner needs Blackwell" in v.summary and "gemm.py" in v.summary
    # the finding names the getter's caller and the value it holds there
    [reader] = [f for f in v.findings if f.location.startswith("sglang/srt/gemm.py")]
    assert (
        "get_runner() hands it out to pick" in reader.why and "Runner(server_args.gemm_runner)" in reader.why
    )
    # on Blackwell, or for a value the refusal does not test, nothing refuses
    assert (
        analyze_flag(index, "--gemm-runner", _facts(100, "fp8"), value="trtllm").verdict != "refuses-to-start"
    )
    assert (
        analyze_flag(index, "--gemm-runner", _facts(90, "fp8"), value="triton").verdict != "refuses-to-start"
    )


def test_a_stored_value_whose_getter_no_running_code_calls_is_off(index) -> None:  # type: ignore[no-untyped-def]
    # an unquantized model builds no QuantLinear: nothing that asks the getter runs
    v = analyze_flag(index, "--gemm-runner", _facts(90, None), value="trtllm")
    assert v.verdict == "no-op", v.summary
    assert "read back through get_runner()" in v.summary, v.summary


def test_flashinfer_trtllm_fp8_gemm_refuses_on_hopper_on_the_real_059_tree(sglang_059) -> None:  # type: ignore[no-untyped-def]
    """0.5.9: `initialize_fp8_gemm_config` stores `Fp8GemmRunnerBackend(backend)` (fp8_utils.py:299);
    `dispatch_w8a8_block_fp8_linear` (:190), which every `Fp8LinearMethod` of a model quantized
    online calls, takes it from the getter and raises for flashinfer_trtllm off Blackwell (:204)."""
    v = research_case(sglang_059, "t3-mixtral-h100x2-fp8", "--fp8-gemm-backend", "flashinfer_trtllm")
    assert v.verdict == "refuses-to-start", v.summary
    assert "fp8_utils.py:204" in v.summary and "Blackwell" in v.summary, v.summary
