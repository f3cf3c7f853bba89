"""Evidence that is the reason (issue 25 item 3), on a dense Llama-3.1-70B on 4 x H100, TP 4, SGLang
0.5.23, with SGLang's own start-up resolution: an `applies` verdict cites the reader that acts on
this deployment, not the first one found (each cited a reader of another mode before)."""

from __future__ import annotations

import pytest

from tests.research_profiles import DATA, PROFILES, profile_argv, profile_facts
from tools.research.analysis import analyze_flag
from tools.research.index import load_index
from tools.research.startup.check import flag_argv, startup_answer

PROFILE = "llama70b-h100x4"


def _verdict(tree, flag: str, value: str | None = None, profile: str = PROFILE):  # type: ignore[no-untyped-def]
    facts = profile_facts(profile)
    startup = startup_answer(
        tree,
        facts,
        flag_argv(flag, value, takes_value=value is not None),
        base_argv=profile_argv(profile),
        model_config=DATA / "model-configs" / PROFILES[profile]["config"],
    )
    return analyze_flag(load_index(tree), flag, facts, value=value, startup=startup)


@pytest.mark.parametrize(
    ("flag", "reason", "not_cited"),
    [
        # Scheduler.init_chunked_prefill turns is_mixed_chunk on (chunked prefill is 8192 here),
        # not the speculative-decoding hook or the DeepSeek sparse-attention backend
        ("--enable-mixed-chunk", "sglang/srt/managers/scheduler.py:", ("speculative_hook", "dsa_backend")),
        # the CUDA-graph batch sizes to compile, not a kernel plugin's module-level probe table
        ("--enable-torch-compile", "cuda_graph_runner.py:", ("kernel_plugins",)),
    ],
)
def test_applies_cites_the_reader_that_acts_here(sglang_0523, flag: str, reason: str, not_cited) -> None:  # type: ignore[no-untyped-def]
    v = _verdict(sglang_0523, flag)
    assert v.verdict == "applies", v.summary
    assert reason in v.summary, v.summary
    assert not any(n in v.summary for n in not_cited), v.summary


def test_radix_cache_is_not_cited_from_another_models_pool(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """DeepSeek-V4's pool configurator is built only for DeepSeek-V4 with hybrid SWA
    (pool_configurator.py:1718, `kvc.is_hybrid_swa` from the model config), the embedding plan only
    reports; neither is the evidence on a dense Llama."""
    v = _verdict(sglang_0523, "--disable-radix-cache")
    assert v.verdict == "applies", v.summary
    for other in ("pool_configurator.py", "embedding_model_spec.py", "mlx", "mamba", "disaggregation"):
        assert other not in v.summary, v.summary


def test_a_moe_flag_on_a_dense_model_says_the_model_has_no_moe(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    v = _verdict(sglang_0523, "--enable-fused-moe-sum-all-reduce")
    assert v.verdict == "no-op", v.summary
    assert "the model has no MoE layers" in v.summary, v.summary


@pytest.mark.parametrize(
    ("flag", "value", "not_cited"),
    [
        # the scheduler sets up chunked prefill; not the sliding-window request cap of another model
        ("--chunked-prefill-size", "4096", ("pool_configurator.py",)),
        # the scheduler caps running requests; not DeepSeek sparse attention's indexer capture
        ("--max-running-requests", "64", ("init_indexer_capturer", "dsa")),
        # the scheduler's own radix switch; not disaggregated decode's pre-allocation queue
        ("--disable-radix-cache", None, ("disaggregation", "mlx")),
    ],
)
def test_the_user_storys_flags_cite_the_scheduler_that_runs_here(sglang_0523, flag, value, not_cited) -> None:  # type: ignore[no-untyped-def]
    """The seed deployment (Qwen3.5-122B-A10B, TP 4 on RTX PRO 6000): a reader reached from the
    scheduler process that this server starts (`callers.reached`) is the evidence: the scheduler
    itself or the KV cache it builds (`build_kv_cache` hands the radix cache its switches)."""
    v = _verdict(sglang_0523, flag, value, profile="qwen35-rtx6000x4")
    assert v.verdict == "applies", v.summary
    ran = ("sglang/srt/managers/scheduler.py:", "sglang/srt/mem_cache/kv_cache_builder.py:")
    assert any(where in v.summary for where in ran), v.summary
    assert not any(n in v.summary for n in not_cited), v.summary
