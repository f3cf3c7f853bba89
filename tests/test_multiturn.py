"""The multi-turn workload: conversations whose history grows and is sent again every turn (shaped
like SGLang's benchmark/hicache/bench_multiturn.py), each turn sent once the one before it was
answered, through the same load generator; per-turn cache hits as the server reports them, and
what the radix cache is worth there (`--disable-radix-cache` on the simulator)."""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from sim.offline import offline_throughput
from sim.scheduler import BLOCK
from tools.bench.loadgen import run_sweep
from tools.bench.multiturn import conversations, multiturn_prompts
from tools.bench.prompts import random_prompts, shared_prefix_prompts
from tools.bench.workload import describe_workload, level_prompts, prefix_share
from tools.config import BenchConfig, ConfigError, load_config

OFF = ["--disable-radix-cache"]
SHAPE = dict(num_rounds=3, request_length=40, sub_question_input_length=8, output_length=5)
SMALL = BenchConfig(
    workload="multiturn", multiturn_num_rounds=3, multiturn_request_length=40,
    multiturn_sub_question_input_length=8, multiturn_output_length=5,
)  # fmt: skip
LONG = BenchConfig(
    concurrency=[8], workload="multiturn", prompts_per_level=8, warmup=0, reps=1, api="generate",
    multiturn_num_rounds=4, multiturn_request_length=2048, multiturn_sub_question_input_length=256,
    multiturn_output_length=16, time_scale=0.1,
)  # fmt: skip
"""Long histories and short answers: what a turn costs is mostly its prefill."""


def expected_cached(prompts: list) -> dict[int, int]:
    """Per turn, the cached tokens a radix cache of 16-token blocks finds: the whole blocks of the
    turn before it (the answer's stand-in and the new question are new)."""
    out: dict[int, int] = {}
    for chain in conversations(prompts, lambda p: p.conversation):
        for prev, cur in zip([None, *chain], chain, strict=False):
            out[cur.turn] = out.get(cur.turn, 0) + (prev.input_len // BLOCK * BLOCK if prev else 0)
    return out


def test_each_turn_sends_the_whole_history_then_a_new_question():
    prompts = multiturn_prompts(2, seed=3, **SHAPE)
    assert [(p.conversation, p.turn) for p in prompts] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [p.input_len for p in prompts] == [40, 53, 66] * 2  # + a 5-token answer, an 8-token question
    assert all(len(p.token_ids) == p.input_len and p.output_len == 5 for p in prompts)
    for prev, cur in zip(prompts, prompts[1:], strict=False):
        if cur.turn:  # the history comes first, as it was sent
            assert cur.token_ids[: prev.input_len] == prev.token_ids
    assert prompts[3].token_ids[:BLOCK] != prompts[0].token_ids[:BLOCK]  # conversations share nothing
    assert prompts == multiturn_prompts(2, seed=3, **SHAPE) != multiturn_prompts(2, seed=4, **SHAPE)
    same_length = {**SHAPE, "sub_question_input_length": 0}  # bench_multiturn: the request length
    assert [p.input_len for p in multiturn_prompts(1, **same_length)] == [40, 85, 130]
    texts = multiturn_prompts(1, seed=3, words=True, **SHAPE)
    assert texts[1].text.startswith(texts[0].text + "\n\n") and texts[2].text.startswith(texts[1].text)
    assert [len(p.text.split()) for p in texts] == [40, 53, 66] and texts[0].token_ids is None


def test_a_level_holds_conversations_and_a_mix_shuffles_whole_ones():
    prompts = level_prompts(SMALL, 8, seed=2)
    assert len(prompts) == 16 * 3  # max(8, 2 x 8) conversations of 3 turns, like 2 x --max-parallel
    mixed = SMALL.model_copy(update={"workload": {"random": 0.5, "multiturn": 0.5}, "input_len": 32})
    prompts = level_prompts(mixed, 8, seed=2)
    chains = conversations(prompts, lambda p: p.conversation)
    assert [p for chain in chains for p in chain] == prompts  # a conversation's turns are adjacent
    assert sorted(len(c) for c in chains) == [1] * 8 + [3] * 8
    assert all([p.turn for p in c] == [0, 1, 2] for c in chains if len(c) == 3)
    assert [len(c) for c in chains] != sorted(len(c) for c in chains)  # shuffled, not in blocks
    # a mix without conversations is shuffled exactly as before they existed
    old = BenchConfig(input_len=32, output_len=4, workload={"random": 0.5, "shared-prefix": 0.5},
                      gsp_system_prompt_len=64, gsp_question_len=16, gsp_prompts_per_group=4)  # fmt: skip
    level_seed = 2 * 1_000_003 + 8
    before = random_prompts(8, input_len=32, output_len=4, seed=level_seed) + shared_prefix_prompts(
        8, num_groups=64, prompts_per_group=4, system_prompt_len=64, question_len=16, output_len=256,
        seed=level_seed + 7,
    )  # fmt: skip
    random.Random(level_seed).shuffle(before)
    assert level_prompts(old, 8, seed=2) == before


def test_the_multiturn_settings_are_read_from_the_config_and_bad_ones_named(tmp_path):
    path = tmp_path / "optagent.toml"
    path.write_text(
        "[bench]\nworkload = { random = 0.5, multiturn = 0.5 }\nmultiturn_num_rounds = 3\n"
        "multiturn_request_length = 256\nmultiturn_sub_question_input_length = 64\n"
    )
    bench = load_config(path).bench
    assert bench.workload == {"random": 0.5, "multiturn": 0.5} and bench.multiturn_num_rounds == 3
    assert (bench.multiturn_request_length, bench.multiturn_sub_question_input_length) == (256, 64)
    assert bench.multiturn_output_length == 64  # bench_multiturn's default
    bad = {
        "multiturn_num_rounds = 0": r"bench\.multiturn_num_rounds: Input should be greater than or equal to 1",
        "multiturn_output_length = -1": r"bench\.multiturn_output_length: Input should be greater than",
        "multiturn_sub_question_input_length = -8": r"bench\.multiturn_sub_question_input_length: Input",
        "multiturn_rounds = 3": r"bench\.multiturn_rounds: unknown key; did you mean 'multiturn_num_rounds'",
        'workload = "multi-turn"': r"bench\.workload",
        "workload = { random = 0.5, multiturn = 0.6 }": "summing to 1",
        'backend = "sglang"\nworkload = "multiturn"': "backend 'sglang' cannot send the multiturn workload",
    }
    for text, message in bad.items():
        path.write_text(f"[bench]\n{text}\n")
        with pytest.raises(ConfigError, match=message):
            load_config(path)


def test_a_conversation_counts_as_prefix_reuse_and_is_described():
    assert prefix_share(BenchConfig(workload="multiturn")) == 1.0
    assert prefix_share(BenchConfig(workload={"random": 0.6, "multiturn": 0.4})) == 0.4
    assert describe_workload(BenchConfig(workload="multiturn")) == (
        "multi-turn conversations (5 turns, 512 tokens then 512 a turn, 64-token answers, the history "
        "sent again every turn)"
    )


def test_offline_a_conversation_waits_for_each_answer():
    one = level_prompts(LONG.model_copy(update={"prompts_per_level": 1}), 8, seed=0)
    assert len(one) == 4
    # its 4 turns go one after another, however many slots the level has
    assert offline_throughput("seed", concurrency=8, prompts=one) == offline_throughput(
        "seed", concurrency=1, prompts=one
    )
    two = level_prompts(LONG.model_copy(update={"prompts_per_level": 2}), 8, seed=0)
    assert offline_throughput("seed", concurrency=2, prompts=two) > 1.2 * offline_throughput(
        "seed", concurrency=1, prompts=two
    )  # two conversations do run side by side (x1.34)


def test_offline_disabling_the_radix_cache_costs_multiturn_far_more_than_random_prompts():
    prompts = level_prompts(LONG, 8, seed=0)
    mean_len = sum(p.input_len for p in prompts) // len(prompts)
    alike = random_prompts(len(prompts), input_len=mean_len, output_len=16, seed=1)  # nothing shared

    def cost(ps: list) -> float:
        return (
            offline_throughput("seed", OFF, concurrency=8, prompts=ps)
            / offline_throughput("seed", concurrency=8, prompts=ps)
            - 1
        )

    assert cost(alike) == 0.0
    assert cost(prompts) < -0.35  # the seed at c=8: -44.9%, every turn's history prefilled again
    assert offline_throughput("seed", concurrency=8, prompts=prompts) > 1.5 * offline_throughput(
        "seed", concurrency=8, prompts=alike
    )  # reuse pays: x1.85 against prompts of the same mean length


@pytest.mark.slow(seconds=25)
def test_served_later_turns_prefill_only_what_is_new(sim_server):
    """Over /generate (SGLang's `meta_info.cached_tokens`): turn k finds turn k-1's history cached,
    exactly its whole 16-token blocks; with the radix cache off nothing is, every history is
    prefilled again (the server log's #new-token), and throughput falls. Each launch measures the
    same level three times (the cache flushed before each) and keeps its fastest: a level lasts
    half a second, which a burst of load on a shared machine can stretch, never shorten."""
    levels, best, prefilled = {}, {}, {}
    for flags in ([], OFF):
        srv = sim_server("seed", flags, time_scale=LONG.time_scale, seed=7)
        sweeps = [asyncio.run(run_sweep(srv.endpoint, LONG)) for _ in range(3)]
        assert all(not s.partial and s.level(8).completed == 32 for s in sweeps)
        levels[bool(flags)] = [s.level(8) for s in sweeps]
        best[bool(flags)] = max(s.level(8).output_throughput for s in sweeps)
        prefilled[bool(flags)] = sum(map(int, re.findall(r"#new-token: (\d+)", srv.log())))
        srv.stop()
    prompts = level_prompts(LONG, 8, 0)
    expected = expected_cached(prompts)
    assert expected[0] == 0 and expected[3] > expected[2] > expected[1] == 8 * 2048
    for on, off in zip(levels[False], levels[True], strict=True):  # the same on every repetition
        assert [t.total_cached_tokens for t in on.turns] == [expected[k] for k in range(4)]
        assert [t.total_cached_tokens for t in off.turns] == [0, 0, 0, 0] and off.cache_hit_rate == 0.0
        assert on.total_input_tokens == off.total_input_tokens == sum(p.input_len for p in prompts)
        rates = [t.cache_hit_rate for t in on.turns]
        assert rates[0] == 0.0 and 0.8 < rates[1] < rates[2] < rates[3] < 1
    assert prefilled[True] - prefilled[False] == 3 * sum(expected.values())  # what the cache saved
    cost = best[True] / best[False] - 1
    print(f"c=8 multi-turn --disable-radix-cache: served {cost:+.1%} (offline -44.9%)")
    assert cost < -0.2


def test_cache_hits_over_the_openai_api_only_with_cache_report(sim_server):
    """`--enable-cache-report` makes SGLang put `prompt_tokens_details.cached_tokens` in the usage
    of the OpenAI routes; without it they report none, and the level says so (None, not 0)."""
    settings = SMALL.model_copy(update={"concurrency": [4], "prompts_per_level": 2, "warmup": 0, "reps": 1})
    expected = expected_cached(level_prompts(settings, 4, 0))
    for flags in (["--enable-cache-report"], []):
        srv = sim_server("seed", flags)
        level = asyncio.run(run_sweep(srv.endpoint, settings)).level(4)
        srv.stop()
        assert level.completed == 6 and [t.turn for t in level.turns] == [0, 1, 2]
        cached = [t.total_cached_tokens for t in level.turns]
        if flags:
            assert cached == [expected[k] for k in range(3)] == [0, 64, 96]  # 40, then 53 -> 3 blocks
            assert level.cache_hit_rate == 160 / (2 * (40 + 53 + 66))
        else:
            assert cached == [None, None, None] and level.cache_hit_rate is None
