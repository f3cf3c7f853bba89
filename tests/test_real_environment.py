"""Setting up the real SGLang server's environment (`sim.real.environment`): what cannot run says
why and what to do, and `optagent sim up --real` lays out, starts, reports and stops a real server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sim.real import environment
from sim.real.environment import EnvironmentSetupError, Setup
from tests.fixtures.sim import free_port

OPTAGENT = [sys.executable, "-c", "from agent.cli.main import app; app()"]


def test_a_kernel_wheel_whose_sha256_differs_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "kernels"
    (folder / "wheels").mkdir(parents=True)
    (folder / "wheels" / environment.KERNEL_WHEEL).write_bytes(b"not the wheel that was built")
    monkeypatch.setenv(environment.KERNEL_ENV, str(folder))
    with pytest.raises(EnvironmentSetupError, match="sha256 is not 6650671b.*refusing"):
        Setup(tmp_path / "root", print).kernels()


def test_no_kernels_anywhere_says_where_to_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(environment.KERNEL_ENV, str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(EnvironmentSetupError, match="neither wheels/.* nor source/"):
        Setup(tmp_path / "root", print).kernels()


def test_no_python_311_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(environment.PYTHON_ENV, "/bin/false")
    with pytest.raises(EnvironmentSetupError, match=r"Python 3\.11.*OPTAGENT_REAL_PYTHON"):
        environment.find_python()


def test_too_little_space_is_said_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(environment, "NEEDED_GB", 1e9)
    root = tmp_path / "cache"
    with pytest.raises(EnvironmentSetupError, match="GB free.*OPTAGENT_CACHE_DIR"):
        environment.ensure_environment(root=root)
    assert not (root / "venv").exists()


def test_the_requirements_are_the_wheels_own_pins_for_the_cpu_path(real_env) -> None:  # type: ignore[no-untyped-def]
    reqs = Setup(real_env.root, print).requirements()
    names = {r.split("=")[0].split("<")[0].split(">")[0].lower() for r in reqs}
    assert "transformers==5.19.0" in reqs and "soundfile==0.13.1" in reqs  # pinned as SGLang 0.5.23 pins them
    assert not names & {"flashinfer_python", "sglang-kernel", "torch_memory_saver", "flash-attn-4"}
    assert names <= environment.CPU_REQUIREMENTS | {"ipython", "partial_json_parser", "prometheus-client"}


@pytest.mark.slow(seconds=90)
def test_sim_up_real_lays_out_starts_reports_and_stops_a_real_server(real_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    host_dir, port = tmp_path / "real", free_port()
    up = subprocess.run([*OPTAGENT, "sim", "up", "--real", "--dir", str(host_dir), "--port", str(port)],
                        capture_output=True, text=True, timeout=400)  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "healthy" in up.stdout and f"--config {host_dir / 'optagent.toml'}" in up.stdout.replace(
            "\n", ""
        )
        info = httpx.get(f"http://127.0.0.1:{port}/get_server_info", timeout=30).json()
        assert info["version"] == "0.5.23" and info["device"] == "cpu" and info["max_running_requests"] == 2
        status = subprocess.run([*OPTAGENT, "sim", "status", "--dir", str(host_dir), "--json"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        state = json.loads(status.stdout)
        assert state["engine"] == "sglang" and state["healthy"] is True
        config = (host_dir / "optagent.toml").read_text()
        assert f'endpoint = "http://127.0.0.1:{port}"' in config and "vocab_size = 2048" in config
    finally:
        down = subprocess.run(
            [*OPTAGENT, "sim", "down", "--dir", str(host_dir)], capture_output=True, text=True, timeout=120
        )
    assert down.returncode == 0 and "stopped" in down.stdout
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
