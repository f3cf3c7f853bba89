"""Failure behaviours reachable through flags, observed from outside like on a real host."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time

import httpx
import pytest

from tests.fixtures.sim import SimStartError


def _greedy(endpoint: str, prompt: str, n: int = 40) -> str:
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    return httpx.post(endpoint + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]


def test_refuses_to_start_with_unsupported_fusion(sim_server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SimStartError) as exc:
        sim_server("seed", ["--enable-flashinfer-allreduce-fusion"])
    assert "exited with 1" in str(exc.value)
    assert "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs" in str(exc.value)


def test_bad_flag_exits_2(sim_server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SimStartError) as exc:
        sim_server("seed", ["--enable-everything"])
    assert "exited with 2" in str(exc.value) and "unrecognized arguments: --enable-everything" in str(
        exc.value
    )


def test_crashes_under_load_when_memory_fraction_leaves_no_activation_room(sim_server) -> None:  # type: ignore[no-untyped-def]
    # at a time scale where one 2,000-token prefill takes milliseconds, so that the requests released
    # together by the barrier queue behind the first and are prefilled together (why: at 0.01 a slow
    # client could send them one by one, each done before the next arrived, and nothing crashed)
    srv = sim_server("seed", ["--mem-fraction-static", "0.95"], time_scale=0.1)
    assert _greedy(srv.endpoint, "light load is fine", 8)  # one small request fits
    together = threading.Barrier(8)

    def post(i: int) -> int:  # prompts of their own: the prefix cache cannot serve one from another
        body = {"prompt": list(range(i * 2000, (i + 1) * 2000)), "max_tokens": 16, "ignore_eos": True}
        together.wait()
        try:
            return httpx.post(srv.endpoint + "/v1/completions", json=body, timeout=30).status_code
        except httpx.TransportError:
            return -1

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(post, range(8)))
    assert srv.proc.wait(timeout=30) == 1
    assert -1 in codes and "CUDA out of memory" in srv.log()


def test_fp8_kv_cache_drifts_from_the_reference(sim_server) -> None:  # type: ignore[no-untyped-def]
    ref = sim_server("h100-llama8b", time_scale=0.002)
    fp8 = sim_server("h100-llama8b", ["--kv-cache-dtype", "fp8_e4m3"], time_scale=0.002)
    prompts = ["Explain KV caches.", "Write a haiku about GPUs.", "What is tensor parallelism?"]
    for prompt in prompts:
        a, b = _greedy(ref.endpoint, prompt).split(), _greedy(fp8.endpoint, prompt).split()
        assert a[:6] == b[:6] and a != b


def test_fp16_on_qwen_gives_garbage(sim_server) -> None:  # type: ignore[no-untyped-def]
    srv = sim_server("h200-qwen30b", ["--dtype", "float16"], time_scale=0.002)
    text = _greedy(srv.endpoint, "Hello there")
    assert not any(ch.isalpha() for ch in text)


def test_never_becomes_healthy(sim_server) -> None:  # type: ignore[no-untyped-def]
    srv = sim_server("seed", ["--enable-torch-compile"], time_scale=0.01, wait=False)
    statuses: set[int] = set()
    deadline = time.monotonic() + 4.0  # > 3x the scaled startup time
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            statuses.add(httpx.get(srv.endpoint + "/health", timeout=2).status_code)
        time.sleep(0.1)
    assert statuses == {503} and srv.proc.poll() is None
    assert "has not finished" in httpx.get(srv.endpoint + "/health").json()["message"]


def test_quantization_flag_against_the_checkpoint(sim_server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SimStartError) as exc:
        sim_server("rtx6000-qwen235b-fp8", ["--quantization", "awq"])
    assert "exited with 1" in str(exc.value)
    assert "Quantization method specified in the model config (fp8) does not match" in str(exc.value)
    # The MXFP4 checkpoint serves with the FlashInfer MXFP4 MoE runner named explicitly.
    srv = sim_server("b200-gptoss120b", ["--moe-runner-backend", "flashinfer_mxfp4"])
    assert _greedy(srv.endpoint, "MXFP4 experts", 8)


def test_bf16_gpt_oss_does_not_fit_one_b200(sim_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from sim.scenario import load_scenario

    config = json.loads((load_scenario("b200-gptoss120b").model_dir / "config.json").read_text())
    del config["quantization_config"]  # the same model at two bytes a weight: ~233 GB
    (tmp_path / "gpt-oss-120b-bf16").mkdir()
    (tmp_path / "gpt-oss-120b-bf16" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SimStartError) as exc:
        sim_server("b200-gptoss120b", ["--model-path", str(tmp_path / "gpt-oss-120b-bf16")])
    assert "Not enough memory" in str(exc.value)
