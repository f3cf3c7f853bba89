"""A flag's value held in a local that the code assigns again (`x = args.b; if x == "auto": x =
pick()`), on a small SGLang-shaped tree and on the real 0.5.23 wheel: the value at a later line
follows from the tests in between (`reach.value_at`), so a refusal further down fires for the
value that reaches it; a value that only a log line also says on its way into a module global is
still a store; a method calling another object's method of its own name reaches that method."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.sglang_src import synthetic_tree
from tests.research_profiles import case_startup, profile_facts, research_case
from tools.research.analysis import analyze_flag
from tools.research.index import load_index

FILES = {
    "srt/server_args.py": """
        from dataclasses import dataclass

        @dataclass
        class ServerArgs:
            bf16_backend: str = "auto"
            gemm_runner: str = "auto"
            tp_size: int = 1
            pp_size: int = 1
            dp_size: int = 1

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--bf16-backend", default=ServerArgs.bf16_backend)
                parser.add_argument("--gemm-runner", default=ServerArgs.gemm_runner)
                parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size)
                parser.add_argument("--pp-size", type=int, default=ServerArgs.pp_size)
                parser.add_argument("--dp-size", type=int, default=ServerArgs.dp_size)
        """,
    "srt/gemm.py": """
        import logging
        from enum import Enum

        from sglang.srt.config import get_args, env_flag
        from sglang.srt.utils import is_sm100_supported

        logger = logging.getLogger(__name__)
        GEMM_RUNNER = None


        class Bf16Backend(Enum):
            AUTO = "auto"
            CUTEDSL = "cutedsl"
            GEMV = "gemv"

            def is_cutedsl(self) -> bool:
                return self == Bf16Backend.CUTEDSL


        def init_bf16():
            backend_str = get_args().bf16_backend
            if backend_str == "auto" and is_sm100_supported():
                backend_str = "cutedsl"
            backend = Bf16Backend(backend_str)
            if backend.is_cutedsl():
                if not is_sm100_supported():
                    raise ValueError("cutedsl needs SM100")


        def init_runner():
            global GEMM_RUNNER
            runner = get_args().gemm_runner
            if runner == "auto":
                if env_flag():
                    runner = "cutlass"
            else:
                if env_flag():
                    logger.warning(f"{runner} overrides the environment")
            GEMM_RUNNER = runner
        """,
}


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return load_index(synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.8"))


def _facts(sm: int) -> dict[str, object]:
    return {"gpu.sm": sm, "gpu.count": 1, "server.tp_size": 1}


def test_the_value_a_reassigned_local_holds_reaches_the_refusal(index) -> None:  # type: ignore[no-untyped-def]
    from tools.research.reach import value_at

    func = index.func("sglang/srt/gemm.py", "init_bf16")
    assert [line for line, _, _ in func.assigned["backend_str"]] == [22, 24]
    refused = analyze_flag(index, "--bf16-backend", _facts(90), value="cutedsl")
    assert refused.verdict == "refuses-to-start", refused.summary
    assert "cutedsl needs SM100" in refused.summary and "gemm.py:28" in refused.summary
    # the value the test at line 23 replaces is not the flag's: nothing refuses for gemv
    assert analyze_flag(index, "--bf16-backend", _facts(90), value="gemv").verdict != "refuses-to-start"
    # and on SM100 cutedsl is what runs
    assert analyze_flag(index, "--bf16-backend", _facts(100), value="cutedsl").verdict != "refuses-to-start"
    from tools.research.guards.terms import Env

    env = Env(_facts(100), {"bf16_backend": "auto"}, frozenset({"bf16_backend"}), dict(func.locals))
    assert value_at(func, "backend_str", 25, env) == "'cutedsl'"  # auto on SM100: replaced
    assert value_at(func, "backend_str", 23, env) == "get_args().bf16_backend"  # before the test
    env = Env(_facts(90), {"bf16_backend": "auto"}, frozenset({"bf16_backend"}), dict(func.locals))
    assert value_at(func, "backend_str", 25, env) == "get_args().bf16_backend"  # the test fails


def test_a_value_also_logged_on_its_way_into_a_global_is_a_store(index) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(index, "--gemm-runner", _facts(90), value="cutlass")
    [reader] = v.findings
    assert "stores the value" in reader.why and "GEMM_RUNNER" in reader.why, reader.why


def test_a_bf16_backend_only_blackwell_runs_refuses_on_hopper_on_the_real_0523_tree(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """0.5.23's `initialize_bf16_gemm_config` (unquant.py:298-345, called by the scheduler) reads
    the flag into `backend_str`, replaces "auto" on SM100 only, and raises for cutedsl off SM100."""
    for value, refuses in (("cutedsl", True), ("gemv", False)):
        v = research_case(sglang_0523, "h100-llama", "--bf16-gemm-backend", value)
        assert (v.verdict == "refuses-to-start") == refuses, (value, v.verdict, v.summary)
    assert "requires SM100/SM103" in v.summary or refuses is False


def test_a_method_calling_another_object_s_method_of_its_own_name_reaches_it(sglang_059) -> None:  # type: ignore[no-untyped-def]
    """0.5.9's `ModelRunner.load_model` calls `self.loader.load_model(...)` (model_runner.py:980):
    the loaders' `load_model` is called there, not only by `get_model` (the encode server's). So
    an FP8 linear method is built for a model quantized online, and its backend is read there."""
    index = load_index(sglang_059)
    loader = index.func("sglang/srt/model_loader/loader.py", "DefaultModelLoader.load_model")
    callers = {(c.path, c.qual) for c, _ in index.call_sites(loader, limit=40, uses=True) or []}
    assert ("sglang/srt/model_executor/model_runner.py", "ModelRunner.load_model") in callers, callers
    case = {"version": "0.5.9", "profile": "h100-llama", "flag": "--fp8-gemm-backend", "value": "triton"}
    facts = {**profile_facts("h100-llama"), "server.quantization": "fp8"}
    v = analyze_flag(
        index, "--fp8-gemm-backend", facts, value="triton", startup=case_startup(sglang_059, case)
    )
    assert v.verdict != "no-op", v.summary  # before: "Fp8Config is not built here"


@pytest.mark.parametrize("sites", [24, 100])
def test_a_class_too_many_model_files_build_is_not_built_where_none_is_loaded(
    sglang_059, monkeypatch, sites
) -> None:  # type: ignore[no-untyped-def]
    """0.5.9's LayerCommunicator is built by 26 decoder layers in 25 model files; a Llama server
    loads none of those files, a Qwen3-MoE server loads one. Past the call sites examined one by one
    (`callers.MAX_SITES`, 24 here) only whether the callers' modules are loaded is asked."""
    from tools.research import callers
    from tools.research.facts import default_facts, deployment_facts

    monkeypatch.setattr(callers, "MAX_SITES", sites)
    index = load_index(sglang_059)
    init = index.func("sglang/srt/layers/communicator.py", "LayerCommunicator.__init__")
    gates = {}
    for profile, built in (("h100-llama", False), ("h100-qwen3moe", True)):
        case = {"version": "0.5.9", "profile": profile, "flag": "--tp-size", "value": "2"}
        facts = deployment_facts(
            index, profile_facts(profile), case_startup(sglang_059, case), default_facts(index.catalog)
        )
        gates[profile] = callers.caller_gate(index, init, facts, {})
        assert (gates[profile] is None) == built, (profile, gates[profile])
    assert "not used by LlamaForCausalLM" in gates["h100-llama"].message
    if sites < 26:
        assert "callers of LayerCommunicator are in modules not loaded here" in gates["h100-llama"].message
