"""The scheduler and performance model without a clock or HTTP: a closed-loop benchmark in virtual time.

Used to calibrate scenarios, by `sim.groundtruth` (the README's tables), by the oracle of
`benchmarks/bench_agent.py` and by tests that check the model's numbers exactly and fast.

The workload: by default every request is a prompt of its own (random prompts: nothing shared).
`prompts` runs the benchmark's own workload instead, what the client sends at a level
(`tools.bench.workload.level_prompts(settings, concurrency, seed)`: random, shared-prefix with the
`gsp_*` settings, or the configured mix); each prompt becomes a request as the served simulator
admits it (`Request.for_prompt`: its prefix blocks, matched by the same radix cache), so
`--disable-radix-cache` costs here what it costs the served simulator on the same prompts. A
multi-turn conversation's turns (`Prompt.conversation`) go in as the client sends them: a turn
once the one before it finished, behind the requests already waiting.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

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


def _request(
    i: int, prompts: Sequence[Any] | None, shared: int, group_size: int, input_len: int, output_len: int
) -> Request:
    """Request `i`: the given prompt (a `tools.bench.prompts.Prompt`, sent with ignore_eos), else a
    prompt of its own after its group's shared system prompt (if any)."""
    if prompts:
        p = prompts[i]
        return Request.for_prompt(p.token_ids or p.text, max_new=p.output_len, stop_at=p.output_len)
    prefix = _group_prompt(i, shared, group_size, input_len) if shared else ()
    return Request(prompt_len=shared + input_len, max_new=output_len, stop_at=output_len, prefix=prefix)


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
    prompts: Sequence[Any] | None = None,
) -> float:
    """Output tokens per simulated second of a closed-loop run at `concurrency` (no noise). With
    `shared_prefix` > 0 every run of `group_size` consecutive requests starts with the same
    `shared_prefix` tokens (a system prompt) before `input_len` tokens of its own. `prompts`: the
    requests to send instead, in order, a conversation's turns one after another (see the module
    docstring)."""
    scn, model, plan = plan_for(scenario, flags)
    return throughput_for_plan(
        scn, model, plan, concurrency=concurrency, requests=requests, input_len=input_len,
        output_len=output_len, seed=seed, shared_prefix=shared_prefix, group_size=group_size, prompts=prompts,
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
    prompts: Sequence[Any] | None = None,
) -> float:
    """Like `offline_throughput` for an already resolved plan."""
    sched = Scheduler(PerfModel(plan, model, scn), plan, seed=seed)
    total = len(prompts) if prompts else requests or max(2 * concurrency, 4)
    ready, later = _turn_order(prompts, total)
    live: list[tuple[Request, int]] = []
    done = tokens = 0
    elapsed = 0.0
    while done < total:
        while len(live) < concurrency and ready:
            i = ready.popleft()
            req = _request(i, prompts, shared_prefix, group_size, input_len, output_len)
            sched.add(req)
            live.append((req, i))
        step = sched.step()
        elapsed += step.seconds
        tokens += sum(n for _, n in step.tokens)
        for _, i in (finished := [(r, i) for r, i in live if r.done]):
            if i in later:  # its conversation's next turn queues behind what already waits
                ready.append(later.pop(i))
        done += len(finished)
        live = [(r, i) for r, i in live if not r.done]
    return tokens / elapsed


def _turn_order(prompts: Sequence[Any] | None, total: int) -> tuple[deque[int], dict[int, int]]:
    """What may be sent first (every prompt alone, and each conversation's first turn, in order),
    and the turn that follows each turn of a conversation (`Prompt.conversation`, as the benchmark
    client sends them: a turn only once the one before it was answered)."""
    ready: deque[int] = deque()
    later: dict[int, int] = {}
    last: dict[Any, int] = {}
    for i in range(total):
        key = getattr(prompts[i], "conversation", None) if prompts else None
        if key is not None and key in last:
            later[last[key]] = i
        else:
            ready.append(i)
        if key is not None:
            last[key] = i
    return ready, later
