"""SGLang's own start-up decisions (tools/research/startup): the version's argument parsing and
resolution run on the deployment's hardware facts in an isolated worker, against the real wheels.
The three cases issue 25 names that argument resolution decides, each wrong before: a refusal on
values a helper returns, a reset before an assert, an alias onto a value already in force."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.research_profiles import DATA, profile_argv, profile_facts
from tools.research.analysis import analyze_flag
from tools.research.index import load_index
from tools.research.startup.check import flag_argv, hardware_of, startup_answer
from tools.research.startup.resolver import Resolver
from tools.research.verdict.calibration import certainty

pytestmark = pytest.mark.server

MIXTRAL = DATA / "model-configs" / "mistralai--Mixtral-8x7B-v0.1_config.json"
DEEPSEEK = DATA / "model-configs" / "deepseek-ai--DeepSeek-V3_config.json"
LLAMA = DATA / "model-configs" / "meta-llama--Meta-Llama-3.1-8B_config.json"


def _verdict(tree, profile: str, config: Path, flag: str, value: str | None = None):  # type: ignore[no-untyped-def]
    facts = profile_facts(profile)
    startup = startup_answer(
        tree, facts, flag_argv(flag, value), base_argv=profile_argv(profile), model_config=config
    )
    return startup, analyze_flag(load_index(tree), flag, facts, value=value, startup=startup)


def _settled(v) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """A verdict nothing unsettled weakens: its rule's record gives its certainty, above 0.6 (the
    calibrated figure itself is tests/test_research_calibration.py's); (rule, basis)."""
    assert not v.unsettled and v.certainty == certainty(v.rule, v.basis) > 0.6, (v.rule, v.basis, v.certainty)
    return v.rule, v.basis


def test_a_refusal_on_a_helpers_return_value_comes_with_sglangs_own_message(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """0.5.23, Mixtral on 2 x A100 (SM80): trtllm_mha refuses at attention_hook.py ~200-206 on the
    backends `attention_backends_of(...)` returns; on 2 x H100 the same flag starts."""
    startup, v = _verdict(sglang_0523, "mixtral-a100x2", MIXTRAL, "--attention-backend", "trtllm_mha")
    assert startup.kind == "refused", startup
    assert v.verdict == "refuses-to-start" and _settled(v) == ("startup-refuses", "startup"), v.summary
    assert "requires Hopper (SM90), Blackwell (SM100), or SM120" in v.summary
    assert startup.where and startup.where.startswith("sglang/srt/arg_groups/attention_hook.py:")
    assert 200 <= int(startup.where.rsplit(":", 1)[1]) <= 206
    hopper = {**profile_facts("mixtral-a100x2"), "gpu.sm": 90, "gpu.name": "NVIDIA H100 80GB HBM3"}
    on_h100 = startup_answer(
        sglang_0523,
        hopper,
        ["--attention-backend", "trtllm_mha"],
        base_argv=["--tp-size", "2"],
        model_config=MIXTRAL,
    )
    assert on_h100.kind == "changed" and on_h100.changed["attention_backend"][1] == "trtllm_mha"


def test_an_assert_defused_by_an_earlier_reset_is_a_no_op(sglang_0515) -> None:  # type: ignore[no-untyped-def]
    """0.5.15.post1, DeepSeek-V3 on 8 x H200, dp-size 1: --enable-dp-lm-head is reset at
    arg_groups/overrides.py ~1779-1782 before the assert at ~1789-1792."""
    startup, v = _verdict(sglang_0515, "deepseekv3-h200x8", DEEPSEEK, "--enable-dp-lm-head")
    assert startup.kind == "same", startup
    assert v.verdict == "no-op" and _settled(v) == ("startup-same", "startup"), v.summary


def test_an_alias_onto_a_value_already_in_force_is_a_no_op(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """0.5.23: --enable-dp-attention becomes attn_dp_size := dp_size (parallel_hook.py ~50-61),
    1 on a one-GPU Llama: nothing changes."""
    startup, v = _verdict(sglang_0523, "llama8b-h100", LLAMA, "--enable-dp-attention")
    assert startup.kind == "same", startup
    assert v.verdict == "no-op" and _settled(v) == ("startup-same", "startup"), v.summary


def test_the_server_picks_a_size_from_gpu_memory_as_sglang_does(sglang_059) -> None:  # type: ignore[no-untyped-def]
    """0.5.9 picks chunked_prefill_size from the GPU's memory: 8192 on an 80 GB H100 (no-op), 4096 on
    a 46 GB L40S (so 8192 changes it)."""
    facts = profile_facts("llama8b-h100")
    flag = ["--chunked-prefill-size", "8192"]
    h100 = startup_answer(sglang_059, facts, flag, base_argv=["--tp-size", "1"], model_config=LLAMA)
    l40s = {**facts, "gpu.sm": 89, "gpu.memory_mib": 46068, "gpu.name": "NVIDIA L40S"}
    small = startup_answer(sglang_059, l40s, flag, base_argv=["--tp-size", "1"], model_config=LLAMA)
    assert h100.kind == "same", h100
    assert small.kind == "changed" and small.changed["chunked_prefill_size"] == (4096, 8192), small


def test_without_the_gpus_memory_and_name_the_start_up_is_not_guessed(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    facts = profile_facts("h100-llama")  # an older profile: SM and count only
    assert hardware_of(facts) is None
    answer = startup_answer(sglang_0523, facts, ["--enable-dp-attention"], base_argv=[], model_config=LLAMA)
    assert answer.kind == "unknown" and "gpu.memory_mib" in answer.message


def test_the_worker_cannot_reach_the_network_or_run_programs(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """A model path the hub would have to answer is 'unknown', never a refusal: the worker is offline."""
    hw = hardware_of(profile_facts("llama8b-h100"))
    assert hw is not None
    with Resolver(sglang_0523, hw) as r:
        answer = r.resolve(["--model-path", "meta-llama/Some-Model-Not-Here"])
    assert answer["ok"] is False and answer["kind"] == "unknown", answer


@pytest.mark.parametrize("version_fixture", ["sglang_049", "sglang_059", "sglang_0515", "sglang_0523"])
def test_every_version_resolves_the_deployment_itself(version_fixture, request) -> None:  # type: ignore[no-untyped-def]
    tree = request.getfixturevalue(version_fixture)
    hw = hardware_of(profile_facts("llama8b-h100"))
    assert hw is not None
    with Resolver(tree, hw) as r:
        answer = r.resolve(["--tp-size", "1"], LLAMA)
    assert answer["ok"], answer
    assert answer["args"]["tp_size"] == 1 and answer["args"]["chunked_prefill_size"] == 8192


def test_a_flag_the_deployment_already_sets_is_compared_without_it(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """The unit already runs --disable-cuda-graph: the question is what the flag does, so the
    deployment is resolved without it and then with it (not twice with it: 'same')."""
    facts = profile_facts("llama8b-h100")
    answer = startup_answer(
        sglang_0523,
        facts,
        ["--disable-cuda-graph"],
        base_argv=["--tp-size", "1", "--disable-cuda-graph", "--random-seed", "-1"],
        model_config=LLAMA,
    )
    assert answer.kind == "changed" and answer.changed["disable_cuda_graph"] == (False, True), answer


def test_sglangs_own_model_config_decides_what_the_model_runner_builds(sglang_059, sglang_0515) -> None:  # type: ignore[no-untyped-def]
    """The worker builds the version's ModelConfig from config.json and the resolved arguments:
    Mixtral is MHA and not hybrid sliding-window, so 0.5.9's SWA pool split (the only reader of
    --swa-full-tokens-ratio, model_runner_kv_cache_mixin.py:273) is called only under
    `if self.is_hybrid_swa:` (:407-408) and never runs: a no-op, citing that call and the fact."""
    startup, v = _verdict(sglang_059, "mixtral-a100x2", MIXTRAL, "--swa-full-tokens-ratio", "0.5")
    assert startup.model["is_hybrid_swa"] is False and startup.model["attention_arch"] == "AttentionArch.MHA"
    assert v.verdict == "no-op", v.summary
    assert (
        "model_runner_kv_cache_mixin.py:408" in v.summary
        and "model_config.is_hybrid_swa = False" in v.summary
    )
    deepseek, _ = _verdict(sglang_0515, "deepseekv3-h200x8", DEEPSEEK, "--enable-dp-lm-head")
    assert deepseek.model["attention_arch"] == "AttentionArch.MLA"


def test_a_flag_that_changes_the_model_config_changes_the_start_up(sglang_0515) -> None:  # type: ignore[no-untyped-def]
    """0.5.15.post1, gpt-oss-120b: --disable-hybrid-swa-memory turns the model's hybrid SWA off in
    ModelConfig itself (what the pools are built from), not only in the server arguments."""
    config = DATA / "model-configs" / "openai--gpt-oss-120b_config.json"
    startup = startup_answer(
        sglang_0515,
        profile_facts("gptoss-b200"),
        ["--disable-hybrid-swa-memory"],
        base_argv=profile_argv("gptoss-b200"),
        model_config=config,
    )
    assert startup.kind == "changed"
    assert startup.changed["model_config.is_hybrid_swa"] == (True, False), startup.changed


def test_a_deprecation_whose_action_stores_nothing_is_dead(sglang_059) -> None:  # type: ignore[no-untyped-def]
    """0.5.9 registers --hybrid-kvcache-ratio as a DeprecatedAction with nargs=0 (server_args.py
    ~3238-3242): it only warns, so no deployment ever sees a value. Its help text names a
    replacement, which must not make it a no-op 'researched through' that replacement."""
    startup, v = _verdict(sglang_059, "llama70b-h100x4", LLAMA, "--hybrid-kvcache-ratio")
    assert startup.kind == "same" and startup.stored is False, startup
    assert v.verdict == "dead" and "stores nothing" in v.summary, v.summary
    stored, _ = _verdict(sglang_059, "llama70b-h100x4", LLAMA, "--enable-mixed-chunk")
    assert stored.stored is True, stored  # a flag the parser keeps: its two parses differ
    # a value that is the flag's default parses as the line without it does, and is kept all the same
    default, v = _verdict(sglang_059, "llama70b-h100x4", LLAMA, "--schedule-policy", "fcfs")
    assert default.kind == "same" and default.stored is True, default
    assert v.verdict == "no-op" and "stores nothing" not in v.summary, v.summary


def test_a_setting_filled_in_at_model_load_is_the_value_that_runs(sglang_049) -> None:  # type: ignore[no-untyped-def]
    """0.4.9 leaves attention_backend None after argument resolution; ModelRunner fills it in at
    model load (model_runner.py ~386-403): fa3 for an MLA model on Hopper with CUDA >= 12.3 (the
    wheel pins torch 2.7.1, whose PyPI build is CUDA 12.6); on an older CUDA not fa3; with the GPU
    unknown, unknown (never the None start-up left)."""
    from tools.research.facts import default_facts, deployment_facts, installed
    from tools.research.gates import filled_in

    index = load_index(sglang_049)
    assert installed(index, {"gpu.sm": 90})["software.cuda"] == "12.6"
    given = profile_facts("deepseekv3-h200x8")
    startup = startup_answer(
        sglang_049,
        given,
        ["--enable-mixed-chunk"],
        base_argv=profile_argv("deepseekv3-h200x8"),
        model_config=DEEPSEEK,
    )
    facts = deployment_facts(index, given, startup, default_facts(index.catalog))
    assert facts["server.attention_backend"] is None  # what start-up leaves
    assert filled_in(index, facts)["server.attention_backend"] == "fa3"
    assert filled_in(index, {**facts, "software.cuda": "12.1"}).get("server.attention_backend") != "fa3"
    unknown_gpu = {k: v for k, v in facts.items() if k != "gpu.sm"}
    assert str(filled_in(index, unknown_gpu)["server.attention_backend"]) == "UNKNOWN"


def test_a_setting_resolution_derives_from_the_flag_is_the_evidence_it_acts(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """0.5.23: --cuda-graph-max-bs-decode is read only by argument code (cuda_graph_hook.py:72-73),
    which turns it into cuda_graph_config.decode (max_bs 256 -> 64 on an 80 GB H100 at TP 1). What
    running code reads is that setting: the verdict is a settled applies that cites it, not an open
    'whether its module is loaded'. Where resolution already picks 256, the same flag is a no-op."""
    startup, v = _verdict(sglang_0523, "llama8b-h100", LLAMA, "--cuda-graph-max-bs-decode", "64")
    assert startup.kind == "changed" and "cuda_graph_config" in startup.changed, startup
    assert v.verdict == "applies" and _settled(v) in {("reader-runs", "reached"), ("reader-runs", "guard")}
    first = v.findings[0]
    assert not first.location.startswith("sglang/srt/arg_groups/"), first
    assert "`cuda_graph_config`" in first.why and "decode.max_bs 256 -> 64" in first.why, first.why
    # the evidence is code that uses the setting, not a compatibility check that only reads it
    assert not first.function.rsplit(".", 1)[-1].startswith(("check", "_check", "validate", "verify")), first
    _, same = _verdict(sglang_0523, "mixtral-a100x2", MIXTRAL, "--cuda-graph-max-bs-decode", "256")
    assert same.verdict == "no-op", same.summary
