"""The correctness probe: identical / drifting / broken, with the first differing position."""

from __future__ import annotations

import asyncio

from tests.test_bench_sse_server import Behaviour, SSEServer
from tools.bench.probe import ProbeOutput, ProbeResult, compare_probe, degenerate, probe_prompts, run_probe


def probe(mode: str = "normal", **kw) -> ProbeResult:
    with SSEServer(Behaviour(probe_mode=mode, **kw)) as srv:
        return asyncio.run(run_probe(srv.endpoint, max_tokens=24))


def test_shipped_prompts_are_sent_and_stored(tmp_path):
    ref = probe()
    assert [o.id for o in ref.outputs] == [p["id"] for p in probe_prompts()] and len(ref.outputs) >= 6
    assert all(o.error is None and len(o.text.split()) == 24 for o in ref.outputs)
    ref.save(tmp_path / "ref.json")
    again = ProbeResult.load(tmp_path / "ref.json")
    verdict = compare_probe(again, probe())
    assert verdict.status == "identical" and verdict.first_diff is None


def test_drift_reports_first_differing_word():
    verdict = compare_probe(probe(), probe("drift"))
    assert verdict.status == "drifting"
    assert verdict.first_diff.word == 10 and verdict.first_diff.candidate.startswith("omega")
    assert "at word 10" in verdict.summary


def test_broken_outputs():
    ref = probe()
    assert compare_probe(ref, probe("repeat")).status == "broken"
    assert compare_probe(ref, probe("empty")).first_diff.reason == "empty answer"
    failed = compare_probe(ref, probe(status=500))
    assert failed.status == "broken" and "HTTP 500" in failed.first_diff.reason


def test_degenerate_detection():
    assert degenerate("the cat sat on the mat and then it went home to sleep") is None
    assert degenerate(" a b a b a b a b a b a b a b a b") == "repeats a 2-word cycle"
    assert degenerate(" #@ %& ?! \ufffd") == "garbage characters"
    ref = ProbeResult(
        endpoint="x", api="completions", max_tokens=4, outputs=[ProbeOutput(id="a", text=" x y")]
    )
    nothing = ProbeResult(
        endpoint="x", api="completions", max_tokens=4, outputs=[ProbeOutput(id="a", error="e")]
    )
    assert compare_probe(nothing, ref).status == "broken"  # a reference without answers proves nothing


def test_probe_against_simulator_lossy_flags(sim_server):
    results = {}
    for name, flags in {
        "base": [],
        "fp8kv": ["--kv-cache-dtype", "fp8_e4m3"],
        "fp16": ["--dtype", "half"],
    }.items():
        server = sim_server("seed", flags)
        results[name] = asyncio.run(run_probe(server.endpoint, max_tokens=40))
        server.stop()
    assert compare_probe(results["base"], results["base"]).status == "identical"
    drift = compare_probe(results["base"], results["fp8kv"])
    assert drift.status == "drifting" and drift.first_diff.word >= 6
    assert compare_probe(results["base"], results["fp16"]).status == "broken"


def test_a_hanging_server_fails_the_probe_on_its_first_prompt():
    import asyncio
    import time

    from tests.test_bench_sse_server import Behaviour, SSEServer
    from tools.bench.probe import run_probe

    with SSEServer(Behaviour(hang_after=1)) as srv:
        started = time.monotonic()
        probe = asyncio.run(run_probe(srv.endpoint, timeout_s=0.5))
        took, sent = time.monotonic() - started, srv.requests
    assert [o.error is None for o in probe.outputs] == [True, False]  # the second hung; no third sent
    assert "timed out" in probe.outputs[1].error and sent == 2 and took < 2


def test_the_probe_paces_one_request_and_bounds_a_sweep_from_below(sim_server):
    """The probe's pace (its answer tokens as the server counted them, over its wall time) gives a
    sweep's least time: a run's budget refuses a baseline that cannot fit from it, never one that can."""
    import time

    from tools.bench.loadgen import run_sweep
    from tools.bench.workload import sweep_seconds
    from tools.config import BenchConfig

    server = sim_server("seed", time_scale=0.25)
    ref = asyncio.run(run_probe(server.endpoint))
    assert ref.tokens >= 4 * len(ref.outputs) and ref.seconds > 0  # usage counted, not words guessed
    pace = ref.token_seconds()
    bench = BenchConfig(concurrency=[1, 8], input_len=128, output_len=32, warmup=1, reps=1, time_scale=0.25)
    started = time.monotonic()
    sweep = asyncio.run(run_sweep(server.endpoint, bench))
    took = time.monotonic() - started
    assert not sweep.partial
    least = sweep_seconds(bench, pace)
    assert least <= took <= 4 * least, (least, took)  # below what it took, yet near enough to decide on


def test_a_server_answering_each_prompt_slowly_is_out_after_the_probes_bound():
    """Each answer inside the per-request timeout, the whole probe still bounded: the candidate is
    broken for the probe after `total_s`, not after one timeout per prompt."""
    import asyncio
    import time

    from tests.test_bench_sse_server import Behaviour, SSEServer
    from tools.bench.probe import probe_prompts, run_probe

    with SSEServer(Behaviour(ttft_s=0.4)) as srv:
        started = time.monotonic()
        probe = asyncio.run(run_probe(srv.endpoint, timeout_s=5.0, total_s=1.0))
        took = time.monotonic() - started
    assert len(probe_prompts()) * 0.4 > 2.0  # unbounded, the probe would take over twice as long
    assert took < 1.6, took
    assert [o.error is None for o in probe.outputs][:2] == [True, True] and probe.outputs[-1].error
    assert "the probe's 1 s bound ran out" in probe.outputs[-1].error
