"""API keys: the simulator enforces `--api-key` like SGLang 0.5.23, and every optagent request sends it."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx

from agent.transcripts.transcript import Transcript
from tests.test_deploy import cli, pid_of
from tools.bench.probe import run_probe
from tools.deploy.health import get_server_info, wait_healthy

KEY = "sk-test-0123456789abcdef"


def test_a_server_with_an_api_key_is_deployed_measured_and_checked(ssh_sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    env = {"OPTAGENT_API_KEY": KEY}
    result = cli("deploy", "--set", f"api-key={KEY}", "--yes", config=sim.config_path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr  # healthy only if the check sent the key
    url = sim.target.endpoint

    # The simulator answers like SGLang: /health open, every API route 401 without the bearer key.
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    for path in ("/v1/models", "/get_server_info"):
        assert httpx.get(url + path, timeout=5).status_code == 401
        assert httpx.get(url + path, timeout=5, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(url + path, timeout=5, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200

    # Health check, server info and probe: fail without the key, pass with it.
    no_key = (
        asyncio.run(wait_healthy(url, timeout=2.0, api_key=None))
        if "OPTAGENT_API_KEY" not in os.environ
        else None
    )
    assert no_key is not None and not no_key.ok and "401" in no_key.reason
    assert asyncio.run(wait_healthy(url, timeout=5.0, api_key=KEY)).ok
    assert asyncio.run(get_server_info(url, api_key=KEY))["version"]
    probe = asyncio.run(run_probe(url, api_key=KEY))
    assert probe.outputs and all(o.error is None for o in probe.outputs)
    assert all("401" in (o.error or "") for o in asyncio.run(run_probe(url)).outputs)

    # Status: the key from the environment or from the config file; without one, not healthy (exit 1).
    pid = pid_of(sim.sim_dir)
    assert cli("status", config=sim.config_path, env=env).returncode == 0
    assert cli("status", config=sim.config_path).returncode == 1
    with_key = tmp_path / "with-key.toml"
    with_key.write_text(sim.config_path.read_text().replace("[target]\n", f'[target]\napi_key = "{KEY}"\n'))
    assert cli("status", config=with_key).returncode == 0
    assert pid_of(sim.sim_dir) == pid

    # The load generator sends it too.
    out = tmp_path / "bench.json"
    bench = cli("bench", "--concurrency", "1", "--input-len", "16", "--output-len", "4", "--prompts-per-level", "2",
                "--reps", "1", "--warmup", "0", "--json", str(out), config=with_key)  # fmt: skip
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert KEY not in out.read_text()
    level = json.loads(out.read_text())["levels"][0]
    assert level["completed"] == 2 and level["output_throughput"] > 0


def test_the_key_never_reaches_a_transcript(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OPTAGENT_API_KEY", KEY)
    t = Transcript.create(
        tmp_path, kind="run", goal="g", model="builtin", target="t", config={"target": {"api_key": KEY}}
    )
    t.event("deploy", {"log": f"server_args={{'api_key': '{KEY}'}}", "cmd": f"--api-key {KEY}", "raw": KEY})
    t.close({"ok": True})
    text = "".join(p.read_text() for p in tmp_path.iterdir())
    assert KEY not in text and "[REDACTED]" in text


def test_bench_serving_on_the_host_gets_the_key_through_stdin(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tools.bench.sglang_backend import run_sweep_sglang
    from tools.config import BenchConfig
    from tools.deploy.remote import LocalTransport

    monkeypatch.setenv("OPTAGENT_API_KEY", KEY)
    seen = tmp_path / "seen"
    python = tmp_path / "python"  # stands in for the host's python running sglang.bench_serving
    python.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$OPENAI_API_KEY" > {seen}.env\nprintf "%s " "$@" > {seen}.argv\nexit 3\n'
    )
    python.chmod(0o755)
    result = asyncio.run(run_sweep_sglang(LocalTransport(), "http://127.0.0.1:9", BenchConfig(concurrency=[1]),
                                          python=str(python), remote_dir=str(tmp_path)))  # fmt: skip
    assert result.partial and "exited 3" in result.errors[0]
    assert Path(f"{seen}.env").read_text().strip() == KEY
    assert (
        KEY not in Path(f"{seen}.argv").read_text()
        and "sglang.bench_serving" in Path(f"{seen}.argv").read_text()
    )


def test_a_key_from_the_config_file_is_redacted_from_the_transcript_header(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from tools.config import Config, TargetConfig

    monkeypatch.delenv("OPTAGENT_API_KEY", raising=False)
    config = Config(target=TargetConfig(api_key=KEY))
    t = Transcript.create(tmp_path, kind="run", goal="g", model="builtin", target="t", config=config)
    t.close({"ok": True})
    text = "".join(p.read_text() for p in tmp_path.iterdir())
    assert KEY not in text and '"api_key": "[REDACTED]"' in text
    assert KEY not in repr(config)  # nor in a traceback or log line that prints the config
