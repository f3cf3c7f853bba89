"""The simulator checked against the real SGLang 0.5.23 it imitates, shape by shape.

Every endpoint optagent reads is asked of both (a real server on this machine's CPU, `sim.real`, and
the simulated dense Llama `h100-llama8b`): status codes, key sets and types of the JSON bodies, the
framing of streamed chunks down to the final usage chunk, error bodies; then start-up and exit
(an unknown flag, an invalid choice, SIGTERM to the process group). A difference is either fixed in
the simulator or listed in `KNOWN` with why it stays (and in sim/README.md): a new difference, or a
listed one that went away, fails here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sim.real.layout import CPU_FLAGS, ENVIRONMENT
from tests.fixtures.sim import free_port, start_sim_server

pytestmark = pytest.mark.slow(seconds=120)

# Differences that stay, each with why (sim/README.md, "Checked against a real server").
KNOWN = {
    # SGLang's dataclass holds more fields than its command line: private `_..._explicitly_set`
    # markers, derived ones (`uses_mamba_radix_cache`, `kv_events`, `status`), watermark settings
    # read from the environment. The simulator reports its flag table; optagent reads none of these.
    "server_info: keys only the real server has": {
        "_radix_eviction_policy_explicitly_set", "_speculative_draft_quantization_explicitly_set",
        "_swa_full_tokens_ratio_explicitly_set", "aux_hidden_state_capture", "custom_sigquit_handler",
        "enable_cp_tp_group_sharing", "grpc_worker_threads", "hicache_object_layout", "kv_events",
        "speculative_boundary_reduction", "startup_time", "stat_loggers", "status", "uses_mamba_radix_cache",
        "watermark_context_window", "watermark_default_enabled", "watermark_enforce_all", "watermark_key",
        "watermark_key_b", "watermark_max_probability", "watermark_mixing_probability",
    },
    "internal_states: keys only the real server has": {
        "_radix_eviction_policy_explicitly_set", "_speculative_draft_quantization_explicitly_set",
        "_swa_full_tokens_ratio_explicitly_set", "aux_hidden_state_capture", "decode_cuda_graph_bs",
        "decode_cuda_graph_memory_gb", "enable_cp_tp_group_sharing", "grpc_worker_threads",
        "speculative_boundary_reduction", "stat_loggers", "uses_mamba_radix_cache",
        "watermark_context_window", "watermark_default_enabled", "watermark_enforce_all", "watermark_key",
        "watermark_key_b", "watermark_max_probability", "watermark_mixing_probability",
    },
    "internal_states: keys only the simulator has": set(),
}  # fmt: skip


def _keys(d: dict[str, Any]) -> set[str]:
    return set(d)


def _types(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Keys both have whose values differ in JSON type (a None on either side is not a type)."""
    out = {}
    for k in set(a) & set(b):
        if a[k] is None or b[k] is None:
            continue
        ta, tb = type(a[k]).__name__, type(b[k]).__name__
        if {ta, tb} <= {"int", "float"}:
            continue
        if ta != tb:
            out[k] = (ta, tb)
    return out


def _stream(endpoint: str, path: str, body: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """The raw SSE lines (blank ones dropped) and the parsed chunks of one streamed request."""
    with httpx.stream("POST", endpoint + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.strip()]
    chunks = [json.loads(line[len("data: ") :]) for line in lines if line != "data: [DONE]"]
    return lines, chunks


@pytest.fixture(scope="module")
def both(real_host):  # type: ignore[no-untyped-def]
    sim = start_sim_server("h100-llama8b")
    try:
        yield real_host.endpoint, sim.endpoint
    finally:
        sim.stop()


def test_health_models_and_server_info_have_the_real_shapes(both) -> None:  # type: ignore[no-untyped-def]
    real, sim = both
    for path in ("/health", "/health_generate"):
        assert (
            httpx.get(real + path, timeout=60).status_code
            == httpx.get(sim + path, timeout=60).status_code
            == 200
        )
    models = [httpx.get(e + "/v1/models", timeout=10).json() for e in both]
    assert _keys(models[0]) == _keys(models[1]) and _keys(models[0]["data"][0]) == _keys(models[1]["data"][0])
    info = [httpx.get(e + "/get_server_info", timeout=10).json() for e in both]
    assert info[0]["version"] == info[1]["version"] == "0.5.23"
    assert _keys(info[0]) - _keys(info[1]) == KNOWN["server_info: keys only the real server has"]
    assert _keys(info[1]) - _keys(info[0]) == set()
    assert _types(info[0], info[1]) == {}
    states = [i["internal_states"][0] for i in info]
    assert _keys(states[0]) - _keys(states[1]) == KNOWN["internal_states: keys only the real server has"]
    assert _keys(states[1]) - _keys(states[0]) == KNOWN["internal_states: keys only the simulator has"]
    assert _types(states[0], states[1]) == {}
    assert _keys(states[0]["memory_usage"]) >= _keys(states[1]["memory_usage"])


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "the river at night", "max_tokens": 4}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "the river at night"}], "max_tokens": 4},
        ),
    ],
)
def test_streamed_chunks_are_framed_like_the_real_servers(both, path: str, body: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    request = {
        "model": "m",
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **body,
    }
    (real_lines, real), (sim_lines, sim) = (_stream(e, path, request) for e in both)
    for lines in (real_lines, sim_lines):
        assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    for chunks in (real, sim):  # the last chunk carries the usage and no choice
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
        assert all(c.get("usage") is None for c in chunks[:-1])
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert _keys(real[0]) == _keys(sim[0])
    for n in (0, 1, -2):  # the first chunk (the chat's role), one with text, the one that finishes
        assert _keys(real[n]) == _keys(sim[n]) and _keys(real[n]["choices"][0]) == _keys(sim[n]["choices"][0])
        if "delta" in real[n]["choices"][0]:
            assert _keys(real[n]["choices"][0]["delta"]) == _keys(sim[n]["choices"][0]["delta"])
    assert _keys(real[-1]["usage"]) == _keys(sim[-1]["usage"])


def test_error_bodies_and_codes_are_the_real_servers(both) -> None:  # type: ignore[no-untyped-def]
    bad = {"model": "m", "prompt": "hi", "max_tokens": -3}
    answers = [httpx.post(e + "/v1/completions", json=bad, timeout=30) for e in both]
    assert answers[0].status_code == answers[1].status_code == 400
    assert _keys(answers[0].json()) == _keys(answers[1].json())
    assert all("max_tokens" in a.json()["message"] and a.json()["code"] == 400 for a in answers)


def _launch(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True
        )


@pytest.mark.parametrize("bad", [["--no-such-flag"], ["--schedule-policy", "fastest"]])
def test_a_refused_start_exits_2_with_argparses_message_on_both(
    real_env, tmp_path: Path, bad: list[str]
) -> None:  # type: ignore[no-untyped-def]
    from sim.scenario import load_scenario

    port = free_port()
    real_argv = [
        str(real_env.python),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(real_env.model_dir),
        *CPU_FLAGS,
    ]
    scn = load_scenario("h100-llama8b")
    sim_argv = [sys.executable, "-m", "sim.cli", "launch_server", "--model-path", str(scn.model_dir)]
    seen = []
    for argv, env in ((real_argv, ENVIRONMENT), (sim_argv, {"OPTAGENT_SIM_SCENARIO": "h100-llama8b"})):
        log = tmp_path / f"{len(seen)}.log"
        start = time.monotonic()
        proc = _launch([*argv, *bad, "--port", str(port)], env, log)
        code = proc.wait(timeout=120)
        seen.append((code, time.monotonic() - start, log.read_text(errors="replace")))
    (real_code, real_s, real_log), (sim_code, _, sim_log) = seen
    assert real_code == sim_code == 2
    word = "unrecognized arguments" if bad[0] == "--no-such-flag" else "invalid choice"
    assert word in real_log and word in sim_log
    from tools.deploy.serverlog import error_line

    assert word in (error_line(real_log) or "") and word in (error_line(sim_log) or "")
    assert real_s < 60  # about 6 s on two cores: a failing start is seen long before the health timeout


def test_sigterm_to_the_group_stops_every_process_of_the_real_server(real_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    argv = [
        str(real_env.python),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(real_env.model_dir),
        *CPU_FLAGS,
    ]
    proc = _launch(
        [*argv, "--max-total-tokens", "2048", "--host", "127.0.0.1", "--port", str(port)],
        ENVIRONMENT,
        tmp_path / "log",
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, (tmp_path / "log").read_text()[-2000:]
            time.sleep(0.5)
        group = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(group) >= 3  # the launcher, the scheduler, the detokenizer
        start = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        while subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True).returncode == 0:
            assert time.monotonic() - start < 30, "a process of the group outlived SIGTERM by 30 s"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
