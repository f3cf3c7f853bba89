"""How much time optagent adds to a deploy beyond the server's own start-up, over SSH on loopback.

Starts a real sshd on 127.0.0.1 and a simulated SGLang host, then:
  1. the server's own start-up: launch its command directly and poll for a one-token generation
     every 10 ms (no optagent involved);
  2. a full optagent deploy + commit over SSH (lock, recovery check, drift check, backup, upload,
     dead-man's switch, stop, start, health wait, commit, unlock).
The difference of the medians is optagent's overhead (target: under one second).

    python benchmarks/bench_deploy.py [--runs 5] [--time-scale 0.01]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim import host  # noqa: E402
from tests.fixtures.sim import free_port  # noqa: E402
from tests.fixtures.sshd import start_sshd  # noqa: E402
from tools.deploy.deployment import Deployment  # noqa: E402
from tools.deploy.units.file import UnitFile  # noqa: E402


def server_startup(unit: UnitFile, endpoint: str) -> float:
    """Seconds from exec to the first successful one-token generation, without optagent."""
    env = {**os.environ, **unit.environment}
    start = time.monotonic()
    proc = subprocess.Popen(unit.exec_argv(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(timeout=2) as client:
            while True:
                try:
                    if client.get(f"{endpoint}/health").status_code == 200:
                        body = {"text": "Hi", "sampling_params": {"max_new_tokens": 1}}
                        if client.post(f"{endpoint}/generate", json=body).status_code == 200:
                            return time.monotonic() - start
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError("the server exited")
                time.sleep(0.01)
    finally:
        proc.terminate()
        proc.wait()


async def one_deploy(target, value: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """One deploy + commit; seconds per phase (deploy steps from the outcome) and remote calls made."""
    phases: dict[str, float] = {}
    start = mark = time.monotonic()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name], mark = now - mark, now

    d = Deployment(target)
    calls = _count_calls(d.transport)
    async with d:
        lap("connect+lock+recover")
        text = UnitFile.parse(await d.known_good()).set_flag("--mem-fraction-static", value).render()
        outcome = await d.deploy(text)
        if not outcome.ok:
            raise RuntimeError(outcome.error)
        lap("deploy")
        await d.commit()
        lap("commit")
    lap("unlock+close")
    phases.update({k: v for k, v in outcome.timings.items() if k != "total"})
    phases["deploy-other"] = phases["deploy"] - sum(outcome.timings[k] for k in STEP_KEYS)
    phases["total"] = time.monotonic() - start
    phases["remote calls"] = float(calls["n"])
    return phases


STEP_KEYS = ("backup", "upload", "arm", "restart", "wait")


def _count_calls(transport) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Count the transport's remote operations (commands and file transfers)."""
    calls = {"n": 0}
    for name in ("run", "read_file", "write_file_atomic", "exists"):
        method = getattr(transport, name)

        async def counted(*args, _method=method, **kwargs):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            return await _method(*args, **kwargs)

        setattr(transport, name, counted)
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--time-scale", type=float, default=0.01)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-deploy-"))
    sshd, sshd_proc = start_sshd(work / "sshd")
    try:
        cfg = host.create(work / "sim", port=free_port(), time_scale=args.time_scale)
        target = cfg.target.model_copy(
            update={
                "transport": "ssh",
                "host": sshd.host,
                "ssh_port": sshd.port,
                "user": sshd.user,
                "identity_file": str(sshd.identity_file),
                "known_hosts": str(sshd.known_hosts),
                "max_restarts_per_minute": 1000,
            }
        )
        unit = UnitFile.load(target.remote_unit)
        own = [server_startup(unit, target.endpoint) for _ in range(args.runs)]
        host.ensure_up(work / "sim")
        runs = [asyncio.run(one_deploy(target, f"0.{80 + i % 2}")) for i in range(args.runs)]
        host.down(work / "sim")
    finally:
        sshd_proc.terminate()
    own_s = statistics.median(own)
    total_s = statistics.median(r["total"] for r in runs)
    print(f"server's own start-up (median of {args.runs}):      {own_s:.3f} s")
    print(f"optagent deploy + commit over SSH (median):   {total_s:.3f} s")
    print(f"optagent's overhead beyond start-up:          {total_s - own_s:.3f} s  (target < 1 s)")
    print("per phase, median (min-max):")
    order = ["connect+lock+recover", "deploy", *STEP_KEYS, "deploy-other", "commit", "unlock+close"]
    for key in [*order, "remote calls"]:
        values = [r[key] for r in runs]
        indent = "    " if key in (*STEP_KEYS, "deploy-other") else "  "
        unit = "" if key == "remote calls" else " s"
        print(
            f"{indent}{key:<{24 - len(indent)}} {statistics.median(values):7.3f}{unit}"
            f"  ({min(values):.3f}-{max(values):.3f})"
        )


if __name__ == "__main__":
    main()
