"""`/get_server_info` reports resolved defaults where SGLang 0.5.23 puts them (live server, loopback)."""

from __future__ import annotations

import httpx


def _info(endpoint: str) -> dict:  # type: ignore[type-arg]
    return httpx.get(endpoint + "/get_server_info", timeout=10).json()


def test_defaults_left_unset_come_back_resolved(sim_server) -> None:  # type: ignore[no-untyped-def]
    # The FP8 Qwen3 scenario sets no --attention-backend and no --chunked-prefill-size.
    info = _info(sim_server("rtx6000-qwen235b-fp8").endpoint)
    assert info["attention_backend"] == "flashinfer"  # SM120 default in 0.5.23
    assert info["chunked_prefill_size"] == 8192  # memory_hook: 60-160 GB GPUs
    assert info["mem_fraction_static"] == 0.88 and info["moe_runner_backend"] == "auto"
    assert info["page_size"] == 1 and info["sampling_backend"] == "flashinfer"
    assert info["cuda_graph_config"]["decode"] == {"backend": "full", "max_bs": 48}
    assert info["max_running_requests"] == 48 and info["version"] == "0.5.23"
    state = info["internal_states"][0]
    assert state["attention_backend"] == "flashinfer" and state["effective_max_running_requests_per_dp"] == 48
    assert info["max_total_num_tokens"] == state["memory_usage"]["token_capacity"] > 100_000


def test_model_overrides_show_at_the_top_level(sim_server) -> None:  # type: ignore[no-untyped-def]
    gpt = _info(sim_server("b200-gptoss120b").endpoint)
    assert (gpt["moe_runner_backend"], gpt["dtype"], gpt["attention_backend"]) == (
        "flashinfer_mxfp4",
        "bfloat16",
        "trtllm_mha",
    )
    assert gpt["page_size"] == 64 and gpt["swa_full_tokens_ratio"] == 0.8
    seed = _info(sim_server("seed").endpoint)
    assert (seed["speculative_num_steps"], seed["speculative_num_draft_tokens"]) == (3, 4)
    assert seed["attention_backend"] == "triton" and seed["chunked_prefill_size"] == 8192
