"""The correctness probe on real generation: SGLang 0.5.23 on this machine's CPU, a tiny random Llama.

A tiny random model's greedy answers, one prompt at a time, are a fingerprint of the numerics: the
same configuration launched twice answers word for word alike, and a change of compute dtype moves
them. So the probe passes a restart of known-good and catches a change it must not let through as
lossless, on the real engine rather than on the simulator's modelled outputs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from sim.real.layout import CPU_FLAGS, ENVIRONMENT
from tests.fixtures.sim import free_port
from tools.bench.probe import ProbeResult, compare_probe, run_probe

pytestmark = pytest.mark.slow(seconds=180)


def _probe(env, tmp_path: Path, extra: list[str]) -> ProbeResult:  # type: ignore[no-untyped-def]
    """Start the real server with `extra` flags, probe it, stop its process group."""
    port = free_port()
    argv = [str(env.python), "-m", "sglang.launch_server", "--model-path", str(env.model_dir), *CPU_FLAGS]
    log = tmp_path / f"{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*argv, *extra, "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **ENVIRONMENT},
            start_new_session=True,
        )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "not healthy in 240 s"
            try:
                if httpx.get(endpoint + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        return asyncio.run(run_probe(endpoint))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_restart_answers_alike_and_a_dtype_change_does_not(real_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reference = _probe(real_env, tmp_path, [])
    assert reference.outputs and all(o.error is None and o.text for o in reference.outputs), reference

    again = compare_probe(reference, _probe(real_env, tmp_path, []))
    assert again.status == "identical", again.summary

    # the checkpoint is bfloat16: float32 compute rounds differently, and greedy answers move
    moved = compare_probe(reference, _probe(real_env, tmp_path, ["--dtype", "float32"]))
    assert moved.status != "identical" and moved.first_diff is not None, moved.summary
