"""The simulated host directory, `sim.host` lifecycle and `optagent sim up/status/down`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from sim import host
from tests.fixtures.sim import free_port
from tools.deploy.units.file import UnitFile

pytestmark = pytest.mark.server


def test_layout_is_a_host(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = sim_host("h200-qwen30b")
    sim_dir = tmp_path / "sim"
    unit_path = Path(config.target.remote_unit)
    assert unit_path == sim_dir / "sglang.service"
    assert unit_path.read_text() == config.target.local_unit.read_text()
    unit = UnitFile.load(unit_path)
    flags = unit.command.flags
    assert flags["--model-path"] == str(sim_dir / "models" / "Qwen3-30B-A3B")
    assert flags["--tp-size"] == "2" and "--enforce-disable-flashinfer-allreduce-fusion" in flags
    assert unit.environment == {"OPTAGENT_SIM_SCENARIO": "h200-qwen30b", "OPTAGENT_SIM_TIME_SCALE": "0.01"}
    assert Path(unit.command.executable).is_absolute()
    assert (
        json.loads((sim_dir / "models" / "Qwen3-30B-A3B" / "config.json").read_text())["num_experts"] == 128
    )
    assert (
        config.target.endpoint
        == (sim_dir / "endpoint").read_text().strip()
        == f"http://127.0.0.1:{flags['--port']}"
    )
    smi = config.target.nvidia_smi
    query = [
        smi,
        "--query-gpu=index,name,memory.total,compute_cap,driver_version",
        "--format=csv,noheader,nounits",
    ]
    lines = subprocess.run(query, capture_output=True, text=True, check=True).stdout.splitlines()
    assert lines == ["0, NVIDIA H200, 143771, 9.0, 570.172.08", "1, NVIDIA H200, 143771, 9.0, 570.172.08"]
    topo = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, check=True).stdout
    assert topo.splitlines()[1].split("\t")[:3] == ["GPU0", " X ", "NV18"]


def test_scenario_path_with_space_is_quoted(tmp_path: Path) -> None:
    src = Path(host.load_scenario("h100-llama8b").source)  # type: ignore[arg-type]
    odd = tmp_path / "my scenarios"
    odd.mkdir()
    (odd / "mine.toml").write_text(src.read_text())
    host.create(tmp_path / "h", scenario=odd / "mine.toml", port=free_port(), time_scale=0.01)
    unit = UnitFile.load(tmp_path / "h" / "sglang.service")
    assert unit.environment["OPTAGENT_SIM_SCENARIO"] == str((odd / "mine.toml").resolve())


def test_ensure_up_status_down(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = sim_host("seed")
    sim_dir = tmp_path / "sim"
    assert host.status(sim_dir)["running"] is False
    up = host.ensure_up(sim_dir)
    assert up.target.endpoint == config.target.endpoint
    assert httpx.get(up.target.endpoint + "/health").status_code == 200
    st = host.status(sim_dir)
    assert st["running"] and st["healthy"] and st["scenario"] == "seed" and st["pid"] > 1
    assert host.ensure_up(sim_dir).target.endpoint == up.target.endpoint  # idempotent
    assert host.status(sim_dir)["pid"] == st["pid"]
    assert host.down(sim_dir) is True
    assert host.status(sim_dir)["running"] is False and host.down(sim_dir) is False
    assert "The server is fired up" in (sim_dir / "run" / "sglang.log").read_text()


def test_cli_up_status_down(tmp_path: Path) -> None:
    sim_dir = tmp_path / "clisim"
    cli = ["optagent", "sim"]  # the console script, as users run it
    port = free_port()
    up = subprocess.run(
        [*cli, "up", "--dir", str(sim_dir), "--port", str(port), "--time-scale", "0.01"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        assert f"http://127.0.0.1:{port}" in up.stdout and "sglang.service" in up.stdout
        st = subprocess.run([*cli, "status", "--dir", str(sim_dir), "--json"], capture_output=True, text=True)
        info = json.loads(st.stdout)
        assert info["healthy"] and info["endpoint"] == f"http://127.0.0.1:{port}"
    finally:
        down = subprocess.run(
            [*cli, "down", "--dir", str(sim_dir)], capture_output=True, text=True, timeout=60
        )
    assert down.returncode == 0 and "stopped" in down.stdout
    bad = subprocess.run(
        [*cli, "up", "--dir", str(sim_dir), "--scenario", "nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown scenario 'nope'" in bad.stderr


def test_cli_up_loads_a_scenario_file_from_any_scenarios_folder(tmp_path: Path) -> None:
    src = Path(host.load_scenario("h100-llama8b").source).read_text()  # type: ignore[arg-type]
    folder = tmp_path / "elsewhere" / "scenarios"  # named like the bundled folder, but not it
    folder.mkdir(parents=True)
    text = src.replace('name = "h100-llama8b"', 'name = "mine"').replace('"llama-3.1-8b"', '"my-llama"')
    (folder / "mine.toml").write_text(text)
    sim_dir, port = tmp_path / "sim", free_port()
    argv = ["optagent", "sim", "up", "--dir", str(sim_dir), "--port", str(port), "--time-scale", "0.01"]
    up = subprocess.run(
        [*argv, "--scenario", str(folder / "mine.toml")], capture_output=True, text=True, timeout=120
    )
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        unit = UnitFile.load(sim_dir / "sglang.service")
        assert unit.environment["OPTAGENT_SIM_SCENARIO"] == str((folder / "mine.toml").resolve())
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "my-llama"
    finally:
        host.down(sim_dir)
    bundled = host.load_scenario("seed")
    assert "OPTAGENT_SIM_SCENARIO=seed\n" in host.render_unit(bundled, tmp_path, port=1, time_scale=1)


def test_down_disarms_a_left_over_deadman_switch(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import asyncio
    import os

    from tools.deploy.deadman import DeadmanSwitch

    config = sim_host("h100-llama8b")
    sim_dir = tmp_path / "sim"
    host.ensure_up(sim_dir)
    manager = host._manager(sim_dir)
    switch = DeadmanSwitch(
        manager.transport,
        manager,
        run_dir=config.target.run_dir,
        unit_path=config.target.remote_unit,
        service="sglang",
    )
    asyncio.run(switch.arm(Path(config.target.remote_unit).read_text(), 600))
    pid_file = sim_dir / "run" / "sglang.deadman.pid"
    for _ in range(50):  # the detached watchdog writes its PID as it starts
        if pid_file.exists() and pid_file.read_text().strip():
            break
        asyncio.run(asyncio.sleep(0.1))
    pid = int(pid_file.read_text())
    assert (sim_dir / "run" / "sglang.deadman-armed").exists()

    assert host.down(sim_dir)
    assert not (sim_dir / "run" / "sglang.deadman-armed").exists()
    for _ in range(50):  # the watchdog's group gets SIGTERM; give it a moment to go
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        asyncio.run(asyncio.sleep(0.1))
    else:
        raise AssertionError(f"watchdog {pid} still alive after sim down")
    assert not host.status(sim_dir)["running"]
