"""The shared-prefix workload (issue 29 item 4): prompts shaped like bench_serving's
generated-shared-prefix dataset, the simulator's prefix cache (so `--disable-radix-cache` costs
throughput on shared system prompts and nothing on random prompts), the configured production mix,
and the workload a trial of a caching, scheduling or memory flag is measured on."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from sim.offline import offline_throughput
from sim.scheduler import BLOCK, PrefixCache, prefix_blocks
from tools.bench.loadgen import run_sweep
from tools.bench.prompts import random_prompts, shared_prefix_prompts
from tools.bench.workload import TRIAL_MIX, level_prompts, mechanisms_of_readers, touches_cache, workload_for
from tools.config import BenchConfig, ConfigError, load_config

GSP = dict(num_groups=64, prompts_per_group=4, system_prompt_len=40, question_len=8, output_len=5)


def test_prompts_share_their_group_system_prompt_and_nothing_else():
    prompts = shared_prefix_prompts(10, seed=3, **GSP)
    assert len(prompts) == 10 and all(len(p.token_ids) == 48 == p.input_len for p in prompts)
    systems = {tuple(p.token_ids[:40]) for p in prompts}
    questions = {tuple(p.token_ids[40:]) for p in prompts}
    assert len(systems) == 3  # ceil(10 / 4) groups, as often reused as in the whole dataset
    assert len(questions) == 10
    assert prompts == shared_prefix_prompts(10, seed=3, **GSP)
    assert prompts != shared_prefix_prompts(10, seed=4, **GSP)
    texts = shared_prefix_prompts(4, seed=3, words=True, **GSP)
    assert len({p.text.split("\n\n")[0] for p in texts}) == 1 and all(p.token_ids is None for p in texts)


def test_level_prompts_follow_the_configured_mix():
    random_only = BenchConfig(input_len=32, output_len=4)
    assert level_prompts(random_only, 8, seed=2) == random_prompts(
        16, input_len=32, output_len=4, seed=2 * 1_000_003 + 8
    )  # the random workload sends exactly what it sent before the mix existed
    mixed = BenchConfig(
        input_len=32, output_len=4, workload={"random": 0.25, "shared-prefix": 0.75},
        gsp_system_prompt_len=64, gsp_question_len=16, gsp_prompts_per_group=4,
    )  # fmt: skip
    prompts = level_prompts(mixed, 8, seed=2)
    assert sorted(p.input_len for p in prompts) == [32] * 4 + [80] * 12
    assert len({tuple(p.token_ids[:64]) for p in prompts if p.input_len == 80}) == 3


def test_the_production_mix_is_read_from_the_config(tmp_path):
    path = tmp_path / "optagent.toml"
    path.write_text("[bench]\nworkload = { random = 0.3, shared-prefix = 0.7 }\ngsp_num_groups = 8\n")
    bench = load_config(path).bench
    assert bench.workload == {"random": 0.3, "shared-prefix": 0.7} and bench.gsp_num_groups == 8
    path.write_text("[bench]\nworkload = { random = 0.3, shared-prefix = 0.3 }\n")
    with pytest.raises(ConfigError, match="workload"):
        load_config(path)


def test_a_caching_flag_is_judged_on_shared_prefixes_unless_the_mix_is_named():
    default = BenchConfig()
    assert workload_for("--disable-radix-cache", default).workload == TRIAL_MIX
    assert workload_for(["--cuda-graph-max-bs", "--chunked-prefill-size"], default).workload == TRIAL_MIX
    assert workload_for("--mem-fraction-static", default).workload == TRIAL_MIX
    assert workload_for("--cuda-graph-max-bs", default) is default
    named = BenchConfig(workload="random")  # the user says production shares no prefix
    assert workload_for("--disable-radix-cache", named) is named
    assert default.workload == "random"  # the configuration itself is left alone


def test_prefix_cache_matches_whole_blocks_and_forgets_the_least_recent():
    a, b = prefix_blocks(list(range(100))), prefix_blocks(list(range(50)) + [7] * 50)
    assert len(a) == 100 // BLOCK and a[:3] == b[:3] and a[3] != b[3]
    cache = PrefixCache(capacity_tokens=8 * BLOCK)
    cache.insert(a)
    assert cache.match(b) == 3 * BLOCK and cache.match(prefix_blocks(list(range(1, 100)))) == 0
    cache.insert(prefix_blocks(list(range(1000, 1050))))  # 3 more blocks: one of `a` must go
    # the block of `a` used least recently is its 4th (the first 3 were just matched through `b`)
    assert len(cache) == 8 * BLOCK and cache.match(a) == 3 * BLOCK
    assert prefix_blocks("the cat " * 10) == prefix_blocks("the cat " * 9 + "the dog")[:1]


def test_disabling_the_radix_cache_costs_only_where_prompts_share_a_prefix():
    off = ["--disable-radix-cache"]
    for c in (1, 64):
        assert offline_throughput("seed", off, concurrency=c) == offline_throughput("seed", concurrency=c)
    shared = dict(input_len=128, shared_prefix=2048, group_size=16, requests=256)
    on64 = offline_throughput("seed", concurrency=64, **shared)
    off64 = offline_throughput("seed", off, concurrency=64, **shared)
    assert off64 < 0.8 * on64  # the seed at c=64: -34%; 2048 of 2176 prompt tokens prefilled again
    assert on64 > offline_throughput("seed", concurrency=64, input_len=2176)  # reuse pays


def test_lpm_prefills_a_new_shared_prefix_once_where_fcfs_prefills_it_per_request():
    lpm = ["--schedule-policy", "lpm"]
    shared = dict(input_len=128, shared_prefix=2048, group_size=16, requests=256)
    fcfs64 = offline_throughput("h100-llama8b", concurrency=64, **shared)
    lpm64 = offline_throughput("h100-llama8b", lpm, concurrency=64, **shared)
    # 64 requests arrive at once: fcfs prefills each group's 2048 tokens up to 16 times
    assert lpm64 > 1.05 * fcfs64
    # one request at a time: nothing waits beside another, nothing to reorder
    assert offline_throughput("h100-llama8b", lpm, concurrency=1, **shared) == offline_throughput(
        "h100-llama8b", concurrency=1, **shared
    )
    for flags in (lpm, [*lpm, "--disable-radix-cache"]):  # no shared prefix, or no cache to match
        assert offline_throughput("h100-llama8b", flags, concurrency=64) == offline_throughput(
            "h100-llama8b", flags[2:], concurrency=64
        )


def test_the_simulated_server_reuses_system_prompts_it_was_sent(sim_server):
    settings = BenchConfig(
        concurrency=[4], output_len=4, warmup=0, reps=1, workload="shared-prefix",
        gsp_system_prompt_len=256, gsp_question_len=16, gsp_prompts_per_group=4, gsp_output_len=4,
    )  # fmt: skip
    cached = {}
    for flags in ([], ["--disable-radix-cache"]):
        srv = sim_server("seed", flags, time_scale=0.002)
        result = asyncio.run(run_sweep(srv.endpoint, settings))
        assert not result.partial and result.level(4).completed == 8
        lines = re.findall(r"#cached-token: (\d+)", srv.log())
        cached[bool(flags)] = sum(map(int, lines))
    # 8 prompts in 2 groups: each group's first prefill computes its system prompt, later ones find it
    # (all 256 tokens: 16 whole blocks), unless a group's prompts were admitted in one batch.
    assert cached[False] >= 256 and cached[False] % BLOCK == 0
    assert cached[True] == 0


def test_the_gsp_keys_and_bench_serving_argv_are_sglang_0523s_own(sglang_0523):
    """The `gsp_*` defaults are bench_serving's, and the argv for a shared-prefix level names only
    options SGLang 0.5.23's `benchmark/serving.py` declares (read from the released wheel)."""
    from tools.bench.sglang_backend import bench_serving_argv

    source = (sglang_0523.package_dir / "benchmark" / "serving.py").read_text()
    declared = dict(re.findall(r'"(--gsp-[a-z-]+)",\s*type=int,\s*default=(\d+)', source))
    ours = {
        f"--{k.replace('_', '-')}": v.default
        for k, v in BenchConfig.model_fields.items()
        if k.startswith("gsp_")
    }
    assert {k: int(declared[k]) for k in ours if k in declared} == ours  # (not --gsp-num-turns: one turn)
    settings = BenchConfig(workload="shared-prefix", gsp_prompts_per_group=4)
    argv = bench_serving_argv("http://h:1", settings, concurrency=8, output_file="o")
    assert argv[argv.index("--dataset-name") + 1] == "generated-shared-prefix"
    assert argv[argv.index("--gsp-num-groups") + 1] == "4"  # 16 prompts in groups of 4
    options = {a for a in argv if a.startswith("--")}
    assert all(f'"{option}"' in source for option in options), options - {
        o for o in options if f'"{o}"' in source
    }
    with pytest.raises(ValueError, match="one dataset"):
        bench_serving_argv("http://h:1", BenchConfig(workload=TRIAL_MIX), concurrency=8, output_file="o")
    assert workload_for("--disable-radix-cache", BenchConfig(backend="sglang")).workload == "shared-prefix"


def trial_workloads(monkeypatch, flag: str, mechanisms: dict | None = None):  # type: ignore[no-untyped-def]
    """The workload of every block of a trial of `flag` (a scripted deployment that loses 30%, the
    real runner), the runner and the record."""
    import agent.trial.steps as steps
    from agent.trial.record import Baseline, TrialChange
    from agent.trial.runner import TrialRunner
    from tests.test_paired_trial import UNIT, Launches
    from tools.bench.objective import objective_from_goal

    launches, workloads = Launches(a=[1.0, 0.999, 1.0], b=[0.7, 0.7]), []

    async def measure(endpoint: str, bench: BenchConfig, **kw: object) -> list:
        workloads.append(bench.workload)
        return launches.block()

    async def nothing(*args: object) -> None:
        return None

    monkeypatch.setattr(steps, "measure", measure)
    monkeypatch.setattr(steps, "warm", nothing)
    monkeypatch.setattr(steps.Trial, "probe_ok", nothing)
    bench = BenchConfig()
    runner = TrialRunner(
        deployment=launches, endpoint="http://127.0.0.1:9", bench=bench, mechanisms=mechanisms or {},
        objective=objective_from_goal("improve throughput"), baseline=Baseline(reps=[], probe=None, text=UNIT),
    )  # fmt: skip
    earlier = launches.block()
    runner.reference, runner.known_good_blocks = earlier, [earlier]
    record = asyncio.run(runner.run([TrialChange(flag=flag)], reason="test"))
    assert runner.bench is bench  # the run's own workload is back after the trial
    return workloads, runner, record, earlier


def test_a_trial_of_a_caching_flag_measures_every_block_on_shared_prefixes(monkeypatch):
    """The trial runner's blocks (known-good before, candidate, and known-good after when one is needed) of
    `--disable-radix-cache` all run on the trial mix; the run's own workload, reference and
    known-good history are back after the trial. The deployment is the scripted one of
    tests/test_paired_trial.py (no GPU); the runner and its decision are the real ones."""
    workloads, runner, record, earlier = trial_workloads(monkeypatch, "--disable-radix-cache")
    assert record.decision == "rolled_back"
    assert {"before", "candidate"} <= set(record.blocks) and len(workloads) >= 2
    assert all(w == TRIAL_MIX for w in workloads)
    assert runner.known_good_blocks == [earlier] and runner.reference is None
    # the record, the report and the review say so: its numbers are not the baseline's workload's
    assert (
        record.workload
        == "50% random prompts (1024 tokens in), 50% shared-prefix prompts (64 groups of 16 sharing a 2048-token system prompt)"
    )  # noqa: E501
    from agent.session import RunResult
    from agent.transcripts.markdown import kept_caption
    from agent.transcripts.report import _review_trial, render_report, run_summary

    report = render_report(RunResult(status="completed", trials=[record]), plot_name=None)
    assert f"  - measured on {record.workload} (both sides)" in report
    assert (
        run_summary(RunResult(status="completed", trials=[record]))["trials"][0]["workload"]
        == record.workload
    )
    assert _review_trial(record).extra["workload"] == record.workload  # the review's trial section
    kept = _review_trial(record.model_copy(update={"decision": "kept"}))
    assert f"both measured on {record.workload}, not the baseline's workload)" in kept_caption(kept)
    plain = trial_workloads(monkeypatch, "--cuda-graph-max-bs")[2]
    assert plain.workload is None and "measured on" not in render_report(
        RunResult(status="completed", trials=[plain]), plot_name=None
    )


FLAGS_0523 = {
    n
    for f in json.loads((Path(__file__).parents[1] / "sim" / "flags-0.5.23.json").read_text())["flags"]
    for n in f["names"]
}
OLD_RISKY = re.compile(
    r"radix|cache|prefix|hicache|schedul|chunked-prefill|max-prefill|mem-fraction|max-running"
    r"|max-total-tokens|page-size|kv-|priority|retract|conservativeness"
)  # the name regex this replaced


def test_what_a_flag_touches_comes_from_what_it_does_not_its_name():
    """Real 0.5.23 flags the old name regex judged wrong either way: 'cache' in a name that never
    touches the prefix cache, and scheduling flags whose names say nothing of it."""
    from types import SimpleNamespace

    from agent.policy.playbook import load_playbook
    from agent.trial.record import mechanism_flags

    levers = load_playbook()
    assert all(lever.mechanism for lever in levers)  # every lever says what it acts on
    playbook = mechanism_flags([SimpleNamespace(flag=lv.flag, lever=lv) for lv in levers])
    default = BenchConfig()
    # research's readers in 0.5.23 (tests/test_shared_prefix.py::test_research_readers_...)
    readers = {
        "--enable-cache-report": [{"location": "sglang/srt/entrypoints/openai/serving_chat.py:837", "state": "on"}],
        "--max-queued-requests": [{"location": "sglang/srt/managers/scheduler.py:1201", "state": "runtime"},
                                  {"location": "sglang/srt/managers/tp_worker.py:88", "state": "runtime"}],
    }  # fmt: skip
    mechanisms = {**playbook, **{f: sorted(mechanisms_of_readers(r)) for f, r in readers.items()}}
    assert mechanisms["--enable-cache-report"] == [] and mechanisms["--max-queued-requests"] == ["scheduling"]
    not_cache = [
        "--enable-cache-report",
        "--disable-outlines-disk-cache",
        "--weight-loader-drop-cache-after-load",
    ]
    scheduling = ["--enable-mixed-chunk", "--max-queued-requests"]
    assert set(not_cache + scheduling) <= FLAGS_0523
    for flag in not_cache:
        assert OLD_RISKY.search(flag) and not touches_cache(flag, mechanisms.get(flag))
        assert workload_for(flag, default, mechanisms=mechanisms) is default
    for flag in scheduling:
        assert not OLD_RISKY.search(flag) and touches_cache(flag, mechanisms[flag])
        assert workload_for(flag, default, mechanisms=mechanisms).workload == TRIAL_MIX
    # the playbook decides over the name: `--cuda-graph-max-bs-decode` acts on kernels only
    assert workload_for(["--cuda-graph-max-bs"], default, mechanisms=playbook) is default
    # a lever that says nothing and no research: the narrow name rule, the last resort
    assert touches_cache("--radix-eviction-policy") and not touches_cache("--enable-cache-report")


def test_research_readers_of_0523_give_the_mechanism(sglang_0523):
    """The readers the research of the running version finds put a flag in its mechanism."""
    from agent.policy.researcher import _usage_result
    from tools.research.analysis import analyze_flag
    from tools.research.index import load_index

    index = load_index(sglang_0523)
    got = {f: mechanisms_of_readers(_usage_result(analyze_flag(index, f, {}))["readers"])
           for f in ("--enable-cache-report", "--max-queued-requests", "--enable-mixed-chunk",
                     "--disable-radix-cache", "--cuda-graph-max-bs-decode")}  # fmt: skip
    assert got["--enable-cache-report"] == set() == got["--cuda-graph-max-bs-decode"]
    assert "scheduling" in got["--max-queued-requests"] and "scheduling" in got["--enable-mixed-chunk"]
    assert "cache" in got["--disable-radix-cache"]


def test_a_trial_of_a_scheduling_flag_the_playbook_names_runs_on_the_mix(monkeypatch):
    """`--enable-mixed-chunk` (no caching word in its name): the runner's mechanisms, as
    `make_runner` fills them from the playbook, send its blocks to the mix."""
    workloads, *_ = trial_workloads(
        monkeypatch, "--enable-mixed-chunk", {"--enable-mixed-chunk": ["scheduling"]}
    )
    assert workloads and all(w == TRIAL_MIX for w in workloads)
    workloads, *_ = trial_workloads(monkeypatch, "--enable-mixed-chunk")  # nothing known: the name rule
    assert workloads and all(w == "random" for w in workloads)


def test_giving_up_prefix_reuse_is_tried_only_where_production_shares_no_prefix():
    from agent.context import DeploymentContext
    from agent.policy.playbook import evaluate, grid_size, load_playbook
    from tools.bench.workload import prefix_share

    assert prefix_share(BenchConfig()) == 0.5  # a caching flag's trial runs on TRIAL_MIX
    assert prefix_share(BenchConfig(workload="random")) == 0.0  # the user says production shares none
    assert prefix_share(BenchConfig(workload={"random": 0.3, "shared-prefix": 0.7})) == 0.7
    assert prefix_share(BenchConfig(backend="sglang")) == 1.0  # bench_serving: shared prefixes alone

    def radix(bench: BenchConfig) -> tuple[object, int]:
        ctx = DeploymentContext(server_info={"disable_radix_cache": False}, prefix_share=prefix_share(bench))
        levers = load_playbook()
        found = {c.flag: c for c in evaluate(levers, ctx.facts)}["--disable-radix-cache"]
        return found, grid_size(levers, ctx.facts)

    mixed, grid = radix(BenchConfig())
    assert mixed.status == "already-set"  # not researched, not trialled
    assert mixed.note.startswith("pointless on this server and load") and "0.5" in mixed.note
    alone, same_grid = radix(BenchConfig(workload="random"))
    assert alone.status == "candidate" and same_grid == grid  # the half-grid budget does not move
