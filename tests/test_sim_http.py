"""The simulated server's HTTP contract, end to end over loopback against a real subprocess."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures.sim import SimServer, start_sim_server


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    srv = start_sim_server("seed", time_scale=0.002, seed=7)
    yield srv
    srv.stop()


def _events(resp: httpx.Response) -> list[str]:
    return [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]


def _stream(server: SimServer, path: str, body: dict) -> list[str]:
    with httpx.stream("POST", server.endpoint + path, json=body, timeout=30) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
        return _events(resp)


def test_info_endpoints(server: SimServer) -> None:
    assert httpx.get(server.endpoint + "/health").status_code == 200
    assert httpx.get(server.endpoint + "/health_generate").status_code == 200
    models = httpx.get(server.endpoint + "/v1/models").json()
    assert models["data"][0]["id"] == "qwen3.5-122b"
    info = httpx.get(server.endpoint + "/get_server_info").json()
    assert info["version"] == "0.5.23" and info["tp_size"] == 4 and info["speculative_algorithm"] == "NEXTN"
    assert info["cuda_graph_max_bs_decode"] == 32 and info["port"] == server.port
    model_info = httpx.get(server.endpoint + "/get_model_info").json()
    assert model_info["model_path"].endswith("Qwen3.5-122B-A10B") and model_info["is_generation"]


def test_streamed_completion_with_token_ids_and_usage(server: SimServer) -> None:
    body = {
        "prompt": list(range(100, 164)),
        "max_tokens": 40,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = _stream(server, "/v1/completions", body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert len(text.split()) == 40
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 64, "completion_tokens": 40, "total_tokens": 104, "reasoning_tokens": 0
    }  # fmt: skip
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)


def test_greedy_output_is_deterministic_per_prompt(server: SimServer) -> None:
    def complete(prompt: str) -> dict:
        body = {"prompt": prompt, "max_tokens": 30, "temperature": 0}
        return httpx.post(server.endpoint + "/v1/completions", json=body, timeout=30).json()

    a, b, c = complete("The capital of France is"), complete("The capital of France is"), complete("Hi")
    assert a["choices"][0]["text"] == b["choices"][0]["text"] != c["choices"][0]["text"]
    assert a["usage"]["prompt_tokens"] == 5
    # Without ignore_eos greedy decoding stops at the same place every time.
    assert a["choices"][0]["finish_reason"] == b["choices"][0]["finish_reason"]
    streamed = _stream(server, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 30,
                                                    "temperature": 0, "stream": True})  # fmt: skip
    text = "".join(json.loads(e)["choices"][0]["text"] for e in streamed[:-1])
    assert text == a["choices"][0]["text"]


def test_chat_stream_and_whole(server: SimServer) -> None:
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "temperature": 0}
    whole = httpx.post(server.endpoint + "/v1/chat/completions", json=body, timeout=30).json()
    assert whole["object"] == "chat.completion" and whole["choices"][0]["message"]["role"] == "assistant"
    events = _stream(server, "/v1/chat/completions", {**body, "stream": True})
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert content == whole["choices"][0]["message"]["content"]


def test_native_generate(server: SimServer) -> None:
    body = {
        "input_ids": [5, 6, 7],
        "sampling_params": {"max_new_tokens": 9, "temperature": 0, "ignore_eos": True},
    }
    out = httpx.post(server.endpoint + "/generate", json=body, timeout=30).json()
    assert out["meta_info"]["completion_tokens"] == 9 and out["meta_info"]["prompt_tokens"] == 3
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 9}
    events = _stream(server, "/generate", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    texts = [json.loads(e)["text"] for e in events[:-1]]
    assert texts[-1] == out["text"] and all(texts[-1].startswith(t) for t in texts)  # cumulative


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400),
        ("/v1/completions", {"prompt": ["a", 1]}, 400),
        ("/v1/completions", {"prompt": "x", "max_tokens": 300000}, 400),
        ("/v1/chat/completions", {"messages": []}, 400),
        ("/nope", {}, 404),
    ],
)
def test_bad_requests(server: SimServer, path: str, body: dict, status: int) -> None:
    resp = httpx.post(server.endpoint + path, json=body, timeout=30)
    assert resp.status_code == status and resp.json()["object"] == "error"


def test_invalid_json_body(server: SimServer) -> None:
    resp = httpx.post(server.endpoint + "/v1/completions", content=b"{not json", timeout=30)
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["message"]


@pytest.mark.quiet
def test_benchmark_figures_are_in_the_servers_seconds_whatever_its_clock(sim_server) -> None:  # type: ignore[no-untyped-def]
    """The simulated clock may run faster than the GPUs it models; a benchmark told how fast
    (`BenchConfig.time_scale`) reports the same simulated tok/s and ITL at either speed."""
    import asyncio

    from tools.bench.loadgen import run_sweep
    from tools.config import BenchConfig

    figures = {}
    for scale in (0.5, 0.25):
        server = sim_server("seed", time_scale=scale)
        bench = BenchConfig(
            concurrency=[1, 8], input_len=256, output_len=32, warmup=1, reps=1, time_scale=scale
        )
        sweep = asyncio.run(run_sweep(server.endpoint, bench))
        assert not sweep.partial, sweep.errors
        figures[scale] = [
            (lv.output_throughput, lv.median_itl_ms) for lv in sweep.levels
        ]  # TTFT: too few ms to compare
    for fast, slow in zip(figures[0.25], figures[0.5], strict=True):
        for a, b in zip(fast, slow, strict=True):
            # unscaled, the faster clock would read twice as much; within 20%: at 4x a 20 ms simulated
            # ITL is 5 ms of wall time, where the client's own jitter alone moved it 13% (17.9 vs 20.6)
            assert a == pytest.approx(b, rel=0.2), figures
    # the seed's GPUs, not the wall clock: c=1 decodes ~125 tok/s in simulated seconds
    assert 80 < figures[0.5][0][0] < 200
