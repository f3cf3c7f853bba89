"""What a benchmark level sends, and which workload a candidate flag must be judged on.

Random prompts share no prefix, so they cannot show what a flag costs the prefix cache: on them
`--disable-radix-cache` looks free, while production traffic with shared system prompts loses all
its prefix reuse. A flag that touches caching, scheduling or memory is therefore measured on a
workload with shared prefixes (`workload_for`), unless the configuration names the production mix.

What a flag touches comes from what it does, in this order: the playbook's `mechanism` of its lever
(`agent/policy/playbook.toml`), else the modules of the running SGLang version that read it (the
research's readers, `mechanisms_of_readers`), else, only when neither is known, a narrow rule on
its name (`NAME_RULE`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from tools.bench.multiturn import conversations, multiturn_prompts
from tools.bench.prompts import Prompt, random_prompts, shared_prefix_prompts
from tools.config import BenchConfig
from tools.flagname import flag_name

Mechanism = Literal[
    "cache", "scheduling", "memory", "kernels", "communication", "speculative", "numerics", "serving"
]
"""What a flag acts on (the playbook's `mechanism` vocabulary)."""
MIX_MECHANISMS = frozenset({"cache", "scheduling", "memory"})
"""Mechanisms whose cost a workload without shared prefixes may hide: what is cached and reused,
which requests run together, how much KV memory holds them."""
READER_MODULES: dict[str, Mechanism] = {
    "mem_cache/": "cache",
    "managers/schedule_policy.py": "scheduling",
    "managers/scheduler.py": "scheduling",
    "managers/scheduler_components/": "scheduling",
    "model_executor/model_runner_components/kv_pool_runtime.py": "memory",
    "arg_groups/memory_hook.py": "memory",
    "arg_groups/kv_cache_hook.py": "memory",
    "arg_groups/hicache_hook.py": "cache",
}
"""SGLang modules (under `sglang/srt/`, 0.5.x layout) whose reading of a flag puts it in a mechanism:
the radix and hierarchical caches and the KV pools, the scheduler and its policy, the memory sizing
done while arguments are resolved. Readers elsewhere (attention kernels, CUDA graphs, the OpenAI
entrypoints: `--enable-cache-report` is read only by `entrypoints/openai/serving_*.py`) put it in none."""
LIVE_STATES = frozenset({"on", "runtime", "unknown"})
"""Reader states (research's `Finding.state`) under which the reader may act on this deployment."""
NAME_RULE = re.compile(
    r"radix|hicache|prefix-cach|schedul|chunked-prefill|max-prefill-tokens|mem-fraction|max-running-requests"
    r"|max-total-tokens|max-queued-requests|page-size|kv-cache|retract"
)
"""The last resort, for a flag neither the playbook nor research describes: words SGLang's names for
caching, scheduling and memory settings use. A name can mislead (`--enable-cache-report` only
reports cached tokens; `--enable-mixed-chunk` schedules prefill with decode without saying so),
which is why it comes last and names no bare `cache`."""
TRIAL_MIX = {"random": 0.5, "shared-prefix": 0.5}
"""The workload of such a trial when the configuration names none: the random-prompt gain and the
prefix-reuse cost in one number."""


def prompts_for_level(settings: BenchConfig, concurrency: int) -> int:
    """Prompts sent at one level: the configured count, or scaled to the level (max(8, 2x)). At low
    concurrency a level is only as steady as its few requests: with speculative decoding the tokens
    accepted per step vary, so one request's time varies by ~7% (MTP, 3 steps, 72% acceptance) and 4
    requests at c=1 measured 2-3% apart repetition to repetition. 16 would halve that but make c=1
    the longest level of a sweep (a 70B model without speculation, whose c=1 varies 0.06%, then ran
    out of budget after 3 trials); 8 is the compromise."""
    return settings.prompts_per_level or max(8, 2 * concurrency)


def sweep_seconds(settings: BenchConfig, token_seconds: float) -> float:
    """The least wall time one sweep of `settings` takes when each request decodes a token every
    `token_seconds` (one request's pace alone, `ProbeResult.token_seconds`): per level, its waves
    (conversations over the concurrency) of a conversation's answer tokens in turn (a multi-turn
    one waits for each answer), and a warm-up wave. A lower bound: a batch decodes each request no
    faster than one alone, and prefill adds to it (measured on the simulated seed, a sweep of levels
    1, 8, 64 took about twice this). A goodput search counts its closed-loop run alone."""
    mix = workload_mix(settings)
    answers = {
        "random": settings.output_len,
        "shared-prefix": settings.gsp_output_len,
        "multiturn": settings.multiturn_num_rounds * settings.multiturn_output_length,
    }
    per_conversation = sum(share * answers.get(name, settings.output_len) for name, share in mix.items())
    waves = sum(-(-prompts_for_level(settings, c) // c) for c in settings.concurrency)
    if settings.goodput_limits:  # one closed-loop run of its requests at once; its rate runs come after
        waves = 1
    return (waves + (1 if settings.warmup else 0)) * per_conversation * token_seconds


def workload_mix(settings: BenchConfig) -> dict[str, float]:
    """The configured workload as fractions (`"random"` -> `{"random": 1.0}`)."""
    w = settings.workload
    return {w: 1.0} if isinstance(w, str) else dict(w)


def describe_workload(settings: BenchConfig) -> str:
    """The workload in words, for a report: `50% random prompts, 50% shared-prefix prompts (...)`."""
    words = {
        "random": f"random prompts ({settings.input_len} tokens in)",
        "shared-prefix": (
            f"shared-prefix prompts ({settings.gsp_num_groups} groups of {settings.gsp_prompts_per_group} "
            f"sharing a {settings.gsp_system_prompt_len}-token system prompt)"
        ),
        "multiturn": (
            f"multi-turn conversations ({settings.multiturn_num_rounds} turns, "
            f"{settings.multiturn_request_length} tokens then "
            f"{settings.multiturn_sub_question_input_length or settings.multiturn_request_length} a turn, "
            f"{settings.multiturn_output_length}-token answers, the history sent again every turn)"
        ),
    }
    mix = workload_mix(settings)
    if len(mix) == 1:
        return words.get(next(iter(mix)), next(iter(mix)))
    return ", ".join(f"{share:.0%} {words.get(name, name)}" for name, share in mix.items())


def mechanisms_of_readers(readers: Iterable[Mapping[str, str]]) -> set[Mechanism]:
    """The mechanisms of a flag from the modules that read it (research's readers: `location`
    `path:line`, `state`), counting only readers that may act here (`LIVE_STATES`)."""
    found: set[Mechanism] = set()
    for reader in readers:
        if reader.get("state", "on") not in LIVE_STATES:
            continue
        path = reader.get("location", "").rsplit(":", 1)[0].removeprefix("sglang/").removeprefix("srt/")
        found.update(m for module, m in READER_MODULES.items() if path.startswith(module))
    return found


def touches_cache(flag: str, mechanisms: Iterable[str] | None = None) -> bool:
    """Does `flag` touch caching, scheduling or memory (so random prompts may hide its cost)?
    `mechanisms`: what it acts on, when known (playbook or readers); None: judged by `NAME_RULE`."""
    if mechanisms is not None:
        return bool(MIX_MECHANISMS & set(mechanisms))
    return bool(NAME_RULE.search(flag_name(flag).lower()))


def workload_for(
    flags: str | Iterable[str],
    settings: BenchConfig,
    *,
    mechanisms: Mapping[str, Iterable[str]] | None = None,
) -> BenchConfig:
    """The benchmark settings a trial of `flags` is measured with: `settings` itself, or, when a flag
    touches caching, scheduling or memory and the configuration left the workload unset (random
    prompts by default, which would show a gain of such a flag and never its cost), the same
    settings on `TRIAL_MIX` (on shared prefixes alone with bench_serving, which cannot mix). A
    workload the configuration names is the production mix and is kept. `mechanisms`: flag -> what
    it acts on, where the playbook or research knows (`touches_cache`)."""
    names = [flags] if isinstance(flags, str) else list(flags)
    known = mechanisms or {}
    if "workload" in settings.model_fields_set or not any(touches_cache(f, known.get(f)) for f in names):
        return settings
    return settings.model_copy(update={"workload": cost_workload(settings)})


def cost_workload(settings: BenchConfig) -> Any:
    """The workload a trial of a flag that touches caching, scheduling or memory runs on: the one
    the configuration names (the production mix), else `TRIAL_MIX` (the shared prefixes alone with
    bench_serving, which runs one dataset per level)."""
    if "workload" in settings.model_fields_set:
        return settings.workload
    return "shared-prefix" if settings.backend == "sglang" else dict(TRIAL_MIX)


def prefix_share(settings: BenchConfig) -> float:
    """The share of that workload that reuses a prefix, a shared system prompt or a conversation's
    history (`bench.prefix_share` of the playbook's facts): 0 when the production mix shares no
    prefix, so a flag that gives up prefix reuse can only gain there."""
    mix = workload_mix(settings.model_copy(update={"workload": cost_workload(settings)}))
    return float(mix.get("shared-prefix", 0.0) + mix.get("multiturn", 0.0))


def level_prompts(
    settings: BenchConfig, concurrency: int, seed: int, file_prompts: list[Prompt] | None = None
) -> list[Prompt]:
    """The prompts of one level: from the prompt file, or generated for the configured workload. A
    distinct seed per (rep, level): within one launch no two levels share a prompt or a system
    prompt, and a baseline and a candidate rep with the same seed send identical prompts. Each of
    the level's `prompts_for_level` is a conversation: one prompt, or a multi-turn conversation's
    turns in order (`Prompt.conversation`); a mix shuffles whole conversations."""
    n = prompts_for_level(settings, concurrency)
    if file_prompts:
        start = (seed * 7919 + concurrency) % len(file_prompts)
        return [file_prompts[(start + i) % len(file_prompts)] for i in range(n)]
    level_seed = seed * 1_000_003 + concurrency
    mix = workload_mix(settings)
    counts = {name: round(n * f) for name, f in mix.items()}
    counts[max(mix, key=mix.__getitem__)] += n - sum(counts.values())  # rounding goes to the largest
    words = settings.api == "chat"
    prompts: list[Prompt] = []
    if counts.get("random"):
        prompts += random_prompts(
            counts["random"], input_len=settings.input_len, output_len=settings.output_len,
            seed=level_seed, words=words, vocab_size=settings.vocab_size,
        )  # fmt: skip
    if counts.get("shared-prefix"):
        prompts += shared_prefix_prompts(
            counts["shared-prefix"], num_groups=settings.gsp_num_groups,
            prompts_per_group=settings.gsp_prompts_per_group,
            system_prompt_len=settings.gsp_system_prompt_len, question_len=settings.gsp_question_len,
            output_len=settings.gsp_output_len, seed=level_seed + 7, words=words,
            vocab_size=settings.vocab_size,
        )  # fmt: skip
    if counts.get("multiturn"):
        prompts += multiturn_prompts(
            counts["multiturn"], num_rounds=settings.multiturn_num_rounds,
            request_length=settings.multiturn_request_length,
            sub_question_input_length=settings.multiturn_sub_question_input_length,
            output_length=settings.multiturn_output_length, seed=level_seed + 13, words=words,
            vocab_size=settings.vocab_size,
        )  # fmt: skip
    if len(mix) > 1:  # the same order as shuffling the prompts when each is a conversation alone
        chains = conversations(prompts, lambda p: p.conversation)
        random.Random(level_seed).shuffle(chains)
        prompts = [p for chain in chains for p in chain]
    return prompts
