"""A simulated GPU host in a directory: unit file, models, a fake `nvidia-smi`, and the running server.

Layout of `sim_dir` (what `optagent sim up` makes and `tools.config.sim_config(sim_dir)` points at):

    sglang.service          the "remote" unit file the service manager starts (ExecStart + Environment=)
    local/sglang.service    the local source-of-truth copy (identical at creation)
    models/<name>/config.json
    bin/nvidia-smi          answers --query-gpu=... --format=csv[,noheader,nounits] and `topo -m`
    endpoint                http://127.0.0.1:<port>
    sim.json                scenario, port and time scale this directory was made with
    run/                    PID file and log of the process manager
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from sim.nvsmi import render_nvidia_smi
from sim.scenario import SCENARIO_DIR, Scenario, load_scenario

SERVICE = "sglang"
DEFAULT_PORT = 30000
_SAFE = re.compile(r"[A-Za-z0-9_@+=:,./-]+\Z")


class SimHostError(Exception):
    """The simulated host could not be laid out, started or reached; the message says why."""


def unit_word(value: str) -> str:
    """One ExecStart/Environment word, quoted by systemd's rules when it needs quoting."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise SimHostError(f"refusing a control character in unit file value {value!r}")
    if _SAFE.match(value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%")
    return f'"{escaped}"'


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(port: int | None) -> int:
    if port is not None:
        if not 1 <= port <= 65535:
            raise SimHostError(f"port must be 1-65535, got {port}")
        return port
    if _port_free(DEFAULT_PORT):
        return DEFAULT_PORT
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sim_command() -> list[str]:
    exe = shutil.which("optagent-sim") or str(Path(sys.executable).with_name("optagent-sim"))
    if Path(exe).exists():
        return [str(Path(exe).resolve())]
    return [sys.executable, "-m", "sim.cli"]


def render_unit(scenario: Scenario, model_dir: Path, *, port: int, time_scale: float) -> str:
    """The systemd unit text for a scenario's baseline launch."""
    argv = [*_sim_command(), "launch_server", "--model-path", str(model_dir), *scenario.launch.flags]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    # Only a file of the bundled folder goes by name: `/some/where/scenarios/x.toml` is not `x`.
    bundled = scenario.source is not None and scenario.source.parent == SCENARIO_DIR.resolve()
    ref = scenario.name if bundled and scenario.source.stem == scenario.name else str(scenario.source)
    environment = {"OPTAGENT_SIM_SCENARIO": ref, "OPTAGENT_SIM_TIME_SCALE": f"{time_scale:g}"}
    description = f"SGLang server (simulated by optagent-sim, scenario {scenario.name})"
    return unit_text(description, environment, argv, program_words=2)


def unit_text(description: str, environment: dict[str, str], argv: list[str], *, program_words: int) -> str:
    """A systemd unit that runs `argv` (its first `program_words` words on the first line, then one
    `--flag [value]` per line) with `environment`, every word quoted by systemd's rules."""
    words = [unit_word(a) for a in argv]
    exec_start = " \\\n    ".join([" ".join(words[:program_words]), *pair_flags(words[program_words:])])
    env = "".join(f"Environment={k}={unit_word(v)}\n" for k, v in environment.items())
    return (
        "[Unit]\n"
        f"Description={description}\n"
        "After=network-online.target\n\n"
        "[Service]\n"
        "Type=simple\n"
        f"{env}"
        f"ExecStart={exec_start}\n"
        "Restart=no\n"
        "TimeoutStopSec=30\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def pair_flags(words: list[str]) -> list[str]:
    """One `--flag [value]` per line, the way people write unit files."""
    out: list[str] = []
    for w in words:
        if w.startswith("--") or not out:
            out.append(w)
        else:
            out[-1] += " " + w
    return out


def create(
    sim_dir: Path, *, scenario: str | Path = "seed", port: int | None = None, time_scale: float | None = None
):  # type: ignore[no-untyped-def]
    """Lay out a simulated host in `sim_dir` (not started); return its `tools.config.Config`."""
    from tools.config import sim_config

    scn = load_scenario(scenario)
    scale = time_scale if time_scale is not None else scn.timing.time_scale
    if not scale > 0:
        raise SimHostError(f"time scale must be positive, got {scale}")
    sim_dir = Path(sim_dir).resolve()
    chosen = pick_port(port)
    model_dir = sim_dir / "models" / scn.model_name
    model_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(scn.model_dir / "config.json", model_dir / "config.json")
    unit = render_unit(scn, model_dir, port=chosen, time_scale=scale)
    (sim_dir / "local").mkdir(exist_ok=True)
    (sim_dir / "run").mkdir(exist_ok=True)
    (sim_dir / "bin").mkdir(exist_ok=True)
    (sim_dir / f"{SERVICE}.service").write_text(unit)
    (sim_dir / "local" / f"{SERVICE}.service").write_text(unit)
    smi = sim_dir / "bin" / "nvidia-smi"
    smi.write_text(render_nvidia_smi(scn.hardware, python=sys.executable))
    smi.chmod(0o755)
    (sim_dir / "endpoint").write_text(f"http://127.0.0.1:{chosen}\n")
    meta = {"scenario": scn.name, "scenario_file": str(scn.source), "port": chosen, "time_scale": scale}
    (sim_dir / "sim.json").write_text(json.dumps(meta, indent=2) + "\n")
    return sim_config(sim_dir)


def _manager(sim_dir: Path):  # type: ignore[no-untyped-def]
    from tools.deploy.remote import LocalTransport
    from tools.deploy.service import ProcessManager

    return ProcessManager(
        LocalTransport(),
        unit_path=str(sim_dir / f"{SERVICE}.service"),
        service=SERVICE,
        run_dir=str(sim_dir / "run"),
    )


def _endpoint(sim_dir: Path) -> str:
    return (sim_dir / "endpoint").read_text().strip()


def _healthy(endpoint: str) -> bool:
    try:
        return httpx.get(endpoint + "/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


async def _ensure_up(sim_dir: Path, timeout: float) -> None:
    manager = _manager(sim_dir)
    if not await manager.is_active():
        await manager.start()
    endpoint = _endpoint(sim_dir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(_healthy, endpoint):
            return
        if not await manager.is_active():
            raise SimHostError(f"the server exited during startup:\n{await manager.logs(30)}")
        await asyncio.sleep(0.1)
    raise SimHostError(f"the server was not healthy within {timeout:.0f}s:\n{await manager.logs(30)}")


def _run(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    raise SimHostError("sim.host's sync functions cannot run inside an event loop; call them via to_thread")


def ensure_up(
    sim_dir: Path, *, scenario: str | Path = "seed", port: int | None = None, time_scale: float | None = None
):  # type: ignore[no-untyped-def]
    """Create `sim_dir` if absent, start the server if it is not running, wait until healthy."""
    from tools.config import sim_config

    sim_dir = Path(sim_dir).resolve()
    if not (sim_dir / f"{SERVICE}.service").exists():
        create(sim_dir, scenario=scenario, port=port, time_scale=time_scale)
    meta = _meta(sim_dir)
    if (
        meta.get("engine") == "sglang"
    ):  # a real server (sim/real): ~20 s to start on two cores, more when loaded
        from tools.config import load_config

        _run(_ensure_up(sim_dir, timeout=300))
        return load_config(sim_dir / "optagent.toml")
    scale = float(meta.get("time_scale", 1.0))
    startup = load_scenario(meta.get("scenario_file") or scenario).timing.startup_s
    # the flags in the unit may add up to ~180 simulated s (torch.compile 120, graph capture 0.1 a batch)
    _run(_ensure_up(sim_dir, timeout=(startup + 180) * scale * 2 + 60))
    return sim_config(sim_dir)


def _meta(sim_dir: Path) -> dict[str, Any]:
    """What `sim.json` says the directory was made with (empty when it has none)."""
    path = sim_dir / "sim.json"
    return json.loads(path.read_text()) if path.exists() else {}


def down(sim_dir: Path) -> bool:
    """Stop the simulated server; True if one was running."""
    sim_dir = Path(sim_dir).resolve()
    if not (sim_dir / f"{SERVICE}.service").exists():
        return False

    async def stop() -> bool:
        from tools.deploy.deadman import DeadmanSwitch

        manager = _manager(sim_dir)
        # A watchdog left armed by a killed optagent would start the server again after `down`.
        switch = DeadmanSwitch(
            manager.transport,
            manager,
            run_dir=str(sim_dir / "run"),
            unit_path=str(sim_dir / f"{SERVICE}.service"),
            service=SERVICE,
        )
        await switch.disarm()
        was = await manager.is_active()
        await manager.stop()
        return was

    return bool(_run(stop()))


def status(sim_dir: Path) -> dict[str, Any]:
    """What is laid out in `sim_dir` and whether its server runs and is healthy."""
    sim_dir = Path(sim_dir).resolve()
    unit = sim_dir / f"{SERVICE}.service"
    info: dict[str, Any] = {
        "dir": str(sim_dir),
        "exists": unit.exists(),
        "service": SERVICE,
        "unit": str(unit),
    }
    if not unit.exists():
        return {**info, "running": False, "healthy": False}
    meta = _meta(sim_dir)

    async def probe() -> tuple[bool, int | None]:
        manager = _manager(sim_dir)
        return await manager.is_active(), await manager.pid()

    running, pid = _run(probe())
    endpoint = _endpoint(sim_dir)
    return {
        **info,
        "local_unit": str(sim_dir / "local" / f"{SERVICE}.service"),
        "endpoint": endpoint,
        "scenario": meta.get("scenario"),
        "engine": meta.get("engine", "simulated"),
        "time_scale": meta.get("time_scale"),
        "running": running,
        "pid": pid if running else None,
        "healthy": running and _healthy(endpoint),
        "log": str(sim_dir / "run" / f"{SERVICE}.log"),
    }
