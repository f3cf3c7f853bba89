"""`optagent-sim launch_server`: parse flags, "load the model", then serve SGLang's API.

Selection of what is simulated (never a launch flag, so it cannot collide with SGLang's):
`OPTAGENT_SIM_SCENARIO` (a bundled name or a scenario file, default `seed`),
`OPTAGENT_SIM_TIME_SCALE` (wall seconds per simulated second, default the scenario's),
`OPTAGENT_SIM_STARTUP_S` (simulated startup seconds, default the scenario's) and
`OPTAGENT_SIM_SEED` (fixes the run-to-run noise; default random, like a real restart).
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import sys
import time

from sim.api import Api
from sim.args import parse_launch_args
from sim.engine import Engine, log
from sim.httpio import serve_connection
from sim.modelinfo import ModelConfigError, load_model_info
from sim.perf import PerfModel
from sim.plan import Plan, StartupError, resolve_plan
from sim.scenario import Scenario, ScenarioError, load_scenario
from sim.scheduler import Scheduler


def _env_float(name: str) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ScenarioError(f"{name}={raw!r} is not a number") from None
    if not value > 0:
        raise ScenarioError(f"{name} must be positive, got {raw}")
    return value


def _fail(message: str) -> int:
    log(message)
    sys.stderr.write(f"Traceback (most recent call last):\n  ...\n{message}\n")
    return 1


def launch(argv: list[str]) -> int:
    """Run the simulated server until killed; returns the exit status of a failed start."""
    args = parse_launch_args(argv)  # exits 2 on bad flags, like SGLang
    try:
        scenario = load_scenario(os.environ.get("OPTAGENT_SIM_SCENARIO") or "seed")
        scale = _env_float("OPTAGENT_SIM_TIME_SCALE") or scenario.timing.time_scale
        startup = _env_float("OPTAGENT_SIM_STARTUP_S")
        if startup is not None:
            scenario = scenario.model_copy(
                update={"timing": scenario.timing.model_copy(update={"startup_s": startup})}
            )
        seed_env = os.environ.get("OPTAGENT_SIM_SEED")
        seed = int(seed_env) if seed_env else None
    except (ScenarioError, ValueError) as e:
        sys.stderr.write(f"optagent-sim: {e}\n")
        return 2
    log(f"server_args={vars(args)}")
    try:
        model = load_model_info(args.model_path)
    except ModelConfigError as e:
        return _fail(f"OSError: {e}")
    try:
        plan = resolve_plan(args, scenario, model)
    except StartupError as e:
        if e.after_load:
            log(f"Load weight begin. avail mem={scenario.hardware.memory_mib / 1024:.2f} GB")
            time.sleep(scenario.timing.startup_s * 0.6 * scale)
        return _fail(str(e))
    try:
        asyncio.run(_serve(args, scenario, model, plan, scale=scale, seed=seed))
    except OSError as e:
        return _fail(f"OSError: {e}")
    except KeyboardInterrupt:
        return 0
    return 0


def _crash(message: str) -> None:
    _fail(message)
    log("Received sigquit from a child process. It usually means the child failed.")
    os._exit(1)


async def _serve(args, scenario: Scenario, model, plan: Plan, *, scale: float, seed: int | None) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    run_factor = math.exp(rng.gauss(0.0, scenario.noise.run_sigma))
    perf = PerfModel(plan, model, scenario)
    scheduler = Scheduler(
        perf, plan, seed=rng.getrandbits(32), run_factor=run_factor, step_sigma=scenario.noise.step_sigma
    )
    engine = Engine(scheduler, time_scale=scale, on_crash=_crash)
    api = Api(args, model, plan, engine)
    startup = scenario.timing.startup_s + plan.extra_startup_s
    api.startup_time = startup  # simulated seconds, as SGLang reports its own start-up's wall seconds
    gib = plan.weight_bytes_per_gpu / 2**30
    log(f"Load weight begin. avail mem={scenario.hardware.memory_mib / 1024:.2f} GB")
    await asyncio.sleep(startup * 0.7 * scale)
    log(f"Load weight end. type={model.architecture}, dtype=torch.bfloat16, mem usage={gib:.2f} GB")
    log(f"KV Cache is allocated. #tokens: {scheduler.capacity}, max_running_requests={scheduler.max_running}")
    if plan.cuda_graph_max_bs:
        log(f"Capture cuda graph begin. This can take up to several minutes. max_bs={plan.cuda_graph_max_bs}")
    server = await asyncio.start_server(
        lambda r, w: serve_connection(r, w, api.handle), host=args.host, port=args.port, limit=1 << 20
    )
    loop_task = asyncio.create_task(engine.run())
    log(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    await asyncio.sleep(startup * 0.3 * scale)
    if plan.hangs_in_warmup:
        log("Warmup: torch.compile of the linear-attention kernels has not finished (stuck).")
    else:
        api.healthy = True
        log("The server is fired up and ready to roll!")
    async with server:
        await asyncio.gather(server.serve_forever(), loop_task)
