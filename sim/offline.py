"""The scheduler and performance model without a clock or HTTP: a closed-loop benchmark in virtual time.

Used to calibrate scenarios, by `sim.groundtruth` (the README's tables) and by tests that check the
model's numbers exactly and fast.
"""

from __future__ import annotations

from sim.args import parse_launch_args
from sim.modelinfo import load_model_info
from sim.perf import PerfModel
from sim.plan import Plan, resolve_plan
from sim.scenario import Scenario, load_scenario
from sim.scheduler import Request, Scheduler, prefix_blocks


def _group_prompt(i: int, shared: int, group_size: int, own: int) -> tuple[int, ...]:
    """Prefix blocks of request `i`: its group's system prompt, then tokens of its own."""
    group = i // group_size
    return prefix_blocks([-1 - group] * shared + [i] * own)


def plan_for(scenario: str | Scenario, flags: list[str] | None = None, *, replace_baseline: bool = False):  # type: ignore[no-untyped-def]
    """(Scenario, ModelInfo, Plan) for the scenario's baseline flags plus `flags`."""
    scn = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    base = [] if replace_baseline else list(scn.launch.flags)
    args = parse_launch_args(["--model-path", str(scn.model_dir), *base, *(flags or [])])
    model = load_model_info(str(scn.model_dir))
    return scn, model, resolve_plan(args, scn, model)


def offline_throughput(
    scenario: str | Scenario,
    flags: list[str] | None = None,
    *,
    concurrency: int,
    requests: int | None = None,
    input_len: int = 1024,
    output_len: int = 256,
    seed: int = 1,
    shared_prefix: int = 0,
    group_size: int = 16,
) -> float:
    """Output tokens per simulated second of a closed-loop run at `concurrency` (no noise). With
    `shared_prefix` > 0 every run of `group_size` consecutive requests starts with the same
    `shared_prefix` tokens (a system prompt) before `input_len` tokens of its own."""
    scn, model, plan = plan_for(scenario, flags)
    return throughput_for_plan(
        scn, model, plan, concurrency=concurrency, requests=requests, input_len=input_len,
        output_len=output_len, seed=seed, shared_prefix=shared_prefix, group_size=group_size,
    )  # fmt: skip


def throughput_for_plan(
    scn: Scenario,
    model,  # type: ignore[no-untyped-def]
    plan: Plan,
    *,
    concurrency: int,
    requests: int | None = None,
    input_len: int = 1024,
    output_len: int = 256,
    seed: int = 1,
    shared_prefix: int = 0,
    group_size: int = 16,
) -> float:
    """Like `offline_throughput` for an already resolved plan."""
    sched = Scheduler(PerfModel(plan, model, scn), plan, seed=seed)
    total = requests or max(2 * concurrency, 4)
    live: list[Request] = []
    issued = done = tokens = 0
    elapsed = 0.0
    while done < total:
        while len(live) < concurrency and issued < total:
            prefix = _group_prompt(issued, shared_prefix, group_size, input_len) if shared_prefix else ()
            req = Request(
                prompt_len=shared_prefix + input_len, max_new=output_len, stop_at=output_len, prefix=prefix
            )
            sched.add(req)
            live.append(req)
            issued += 1
        step = sched.step()
        elapsed += step.seconds
        tokens += sum(n for _, n in step.tokens)
        finished = [r for r in live if r.done]
        done += len(finished)
        live = [r for r in live if not r.done]
    return tokens / elapsed
