"""Three-valued guard evaluation (tools.research.guard_eval): platform predicates from hardware facts, `and`/
`or`/`not`/comparisons, unknown kept unknown, and code names bound to facts only where they mean them."""

from __future__ import annotations

import pytest

from tools.research.guard_eval import UNKNOWN, evaluate, evaluate_all
from tools.research.guards.terms import Env, non_default

SM120 = {"gpu.sm": 120, "model.experts_per_tok": 8, "model.quantization": None, "server.tp_size": 4}


def _eval(text: str, facts: dict | None = None, **kw):  # type: ignore[no-untyped-def]
    env = Env(facts=SM120 if facts is None else facts, flag=kw.pop("flag", {}), **kw)
    return evaluate(text, env)


@pytest.mark.parametrize(
    ("guard", "sm", "expected"),
    [
        ("(_is_sm90_supported or _is_sm100_supported)", 120, False),
        ("(_is_sm90_supported or _is_sm100_supported)", 90, True),
        ("(_is_sm90_supported or _is_sm100_supported)", 103, True),
        ("not (get_platform().is_sm90 or get_platform().is_sm100)", 120, True),
        ("is_sm120_supported()", 120, True),
        ("is_blackwell()", 120, True),
        ("is_cuda() and not is_hip() and not _is_npu", 90, True),
        ("torch.cuda.get_device_capability() >= (9, 0)", 120, True),
        ("torch.cuda.get_device_capability()[0] == 9", 90, True),
        ("some_object.capability[0] == 9", 90, UNKNOWN),
        ("get_device_sm() in (90, 100)", 120, False),
    ],
)
def test_platform_predicates_map_to_the_gpu(guard: str, sm: int, expected) -> None:  # type: ignore[no-untyped-def]
    out = _eval(guard, {"gpu.sm": sm})
    assert out.value is expected if expected is UNKNOWN else out.value == expected
    if expected is not UNKNOWN:
        assert any("gpu" in u for u in out.used)


def test_without_hardware_facts_the_answer_is_unknown_never_a_guess() -> None:
    out = _eval("_is_sm90_supported or _is_sm100_supported", {})
    assert out.value is UNKNOWN and out.missing == ["gpu.sm"]
    # Kleene logic: a known False decides an `and` whatever the unknown part is
    assert _eval("_is_sm90_supported and _is_flashinfer_available").value is False
    assert _eval("_is_sm120_supported or _is_flashinfer_available").value is True
    assert _eval("_is_flashinfer_available").missing == ["software.flashinfer"]


def test_code_names_bind_to_model_facts_only_where_they_mean_them() -> None:
    moe = "sglang/srt/layers/moe/fused_moe.py::fused_experts"
    assert _eval("topk > 2", where=moe).value is True  # the MoE kernel's top-k
    # outside MoE code a bare `topk` is someone else's (e.g. a speculative draft backend's parameter)
    assert _eval("topk > 1", where="sglang/srt/layers/attention/x.py::DraftBackend.__init__").value is UNKNOWN
    assert _eval("config.num_experts_per_tok > 2").value is True
    # speculative decoding's `self.topk` is not the MoE top-k: runtime state, unknown
    out = _eval("self.topk > 2")
    assert out.value is UNKNOWN and out.runtime
    # a local `topk` taken from another flag is that flag, not the MoE top-k
    env_locals = {"topk": "server_args.speculative_eagle_topk"}
    facts = {**SM120, "server.speculative_eagle_topk": 1}
    out = _eval("topk > 2", facts, locals=env_locals, dests=frozenset({"speculative_eagle_topk"}), where=moe)
    assert out.value is False and "server.speculative_eagle_topk = 1" in out.used


def test_the_flag_under_research_and_other_flags() -> None:
    flag = {"flashinfer_allreduce_fusion_backend": "auto"}
    out = _eval("get_exec().comm.flashinfer_allreduce_fusion_backend is None", flag=flag)
    assert out.value is False and out.flag_dependent
    out = _eval(
        "backend == 'cutedsl'", locals={"backend": "cfg.flashinfer_allreduce_fusion_backend"}, flag=flag
    )
    assert out.value is False and out.flag_dependent
    assert _eval("server_args.tp_size > 1", dests=frozenset({"tp_size"})).value is True
    assert _eval("cfg.nnodes == 1", dests=frozenset({"nnodes"})).missing == ["server.nnodes"]
    # a value flag set to "something else than its default"
    some = {"chunked_prefill_size": non_default(None)}
    assert _eval("cfg.chunked_prefill_size is not None", flag=some).value is True
    assert _eval("cfg.chunked_prefill_size > 4096", flag=some).value is UNKNOWN


def test_quantized_kernels_follow_the_model_quantization() -> None:
    assert _eval("not use_int8_w8a16 and not use_int4_w4a16").value is True
    awq = {**SM120, "model.quantization": "awq"}
    assert _eval("not use_int4_w4a16", awq).value is False


def test_conjunction_of_guards() -> None:
    env = Env(facts=SM120, flag={})
    assert evaluate_all([], env).value is True
    assert evaluate_all(["num_experts_per_tok > 2", "tp_size > 1"], env).value is True
    assert evaluate_all(["num_experts_per_tok > 2", "is_hip()"], env).value is False
    assert evaluate_all(["num_experts_per_tok > 2", "some_runtime_value"], env).value is UNKNOWN


def test_world_sizes_are_topology_facts_only_where_they_clearly_are() -> None:
    one = {"server.tp_size": 1, "server.pp_size": 1, "server.dp_size": 1}
    four = {**one, "server.tp_size": 4}
    for text in (
        "world_size <= 1",
        "tp_group.world_size <= 1",
        "get_tensor_model_parallel_world_size() == 1",
    ):
        out = _eval(text, one)
        assert out.value is True and "one rank" in out.used[0], text
    assert _eval("self.attn_tp_size > 1", one).value is False
    assert _eval("world_size <= 1", four).value is UNKNOWN  # may span pipeline ranks or be a subgroup
    assert _eval("get_tp_group().world_size", four).value == 4
    assert _eval("get_tensor_model_parallel_world_size() > 1", four).value is True
    assert _eval("self.tp_size", four).value == 4
    assert _eval("max_world_size > 1", one).value is UNKNOWN  # a limit, not the running size
    assert _eval("world_size <= 1", {"server.tp_size": 1}).value is UNKNOWN  # pp/dp not known


CPU_ENGINE = {"gpu.count": 0, "flag.device": "cpu", "cpu.arch": "x86_64", "cpu.amx": False}


@pytest.mark.parametrize(
    ("guard", "extra", "expected"),
    [
        ("_is_cpu", {"env.SGLANG_USE_CPU_ENGINE": "1"}, True),
        ("_is_cpu", {"env.SGLANG_USE_CPU_ENGINE": "0"}, False),
        ("_is_cpu", {}, UNKNOWN),  # the variable may come from elsewhere than the unit
        ("_is_cpu", {"cpu.arch": "ppc64le", "env.SGLANG_USE_CPU_ENGINE": "1"}, False),
        ("is_host_cpu_x86()", {}, True),
        ("is_host_cpu_arm64()", {}, False),
        ("_is_cpu_amx_available", {}, False),
        ("_is_cpu_amx_available", {"cpu.amx": True}, UNKNOWN),  # and sgl_kernel's CPU ops
        ("_is_cuda", {}, False),
        ("_is_sm100_supported or is_blackwell()", {}, False),
        ("is_hopper_with_cuda_12_3()", {}, False),
        ("_is_flashinfer_available", {}, False),
        ("_is_hip", {}, UNKNOWN),  # the host's torch build
    ],
)
def test_a_cpu_engine_answers_from_its_host(guard: str, extra: dict, expected) -> None:  # type: ignore[no-untyped-def]
    out = _eval(guard, {**CPU_ENGINE, **extra})
    assert out.value is UNKNOWN if expected is UNKNOWN else out.value is expected, (out.value, out.used)
    assert out.used or out.missing


def test_a_gpu_deployment_is_not_the_cpu_engine() -> None:
    out = _eval("_is_cpu and _is_cpu_amx_available", {"gpu.sm": 90, "gpu.count": 8})
    assert out.value is False, out
    # AMX is the host CPU's, GPUs or not: never answered from the GPUs
    assert _eval("_is_cpu_amx_available", {"gpu.sm": 90, "gpu.count": 8}).value is UNKNOWN
