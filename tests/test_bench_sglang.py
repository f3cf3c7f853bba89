"""The bench_serving backend: command line, parsing its real result shape, running through a transport."""

from __future__ import annotations

import asyncio
import json
import stat

import pytest

from tools.bench.sglang_backend import (
    BenchServingError,
    bench_serving_argv,
    parse_bench_serving,
    run_sweep_sglang,
)
from tools.config import BenchConfig
from tools.deploy.remote import LocalTransport

# The key set of the dict sglang.benchmark.serving (0.5.23) appends to --output-file, in its order.
REAL_KEYS = [
    "tag",
    "backend",
    "dataset_name",
    "request_rate",
    "max_concurrency",
    "sharegpt_output_len",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "server_info",
    "duration",
    "completed",
    "total_input_tokens",
    "total_input_text_tokens",
    "total_input_vision_tokens",
    "total_output_tokens",
    "total_output_tokens_retokenized",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "mean_e2e_latency_ms",
    "median_e2e_latency_ms",
    "std_e2e_latency_ms",
    "p90_e2e_latency_ms",
    "p95_e2e_latency_ms",
    "p99_e2e_latency_ms",
    "mean_ttft_ms",
    "median_ttft_ms",
    "std_ttft_ms",
    "p90_ttft_ms",
    "p95_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "std_tpot_ms",
    "p90_tpot_ms",
    "p95_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "std_itl_ms",
    "p90_itl_ms",
    "p95_itl_ms",
    "p99_itl_ms",
    "concurrency",
    "accept_length",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
]


def real_line(*, completed: int = 16, concurrency: int = 8) -> str:
    values = {k: 1.5 for k in REAL_KEYS}
    values.update(
        tag=None, backend="sglang-oai", dataset_name="random-ids", request_rate=float("inf"),
        max_concurrency=concurrency, sharegpt_output_len=None, random_range_ratio=1.0,
        server_info={"version": "0.5.23", "tp_size": 4}, duration=4.0, completed=completed,
        total_input_tokens=1024 * completed, total_output_tokens=256 * completed, output_throughput=1024.0,
        mean_ttft_ms=150.0, p99_itl_ms=31.5, accept_length=None,
    )  # fmt: skip
    if completed == 0:
        values.update(mean_e2e_latency_ms=float("nan"), output_throughput=0.0, mean_ttft_ms=0.0)
    assert list(values) == REAL_KEYS
    return json.dumps(values)  # writes Infinity/NaN exactly as bench_serving's json.dumps does


def test_argv_for_each_api():
    s = BenchConfig(api="chat", input_len=1024, output_len=256, warmup=2)
    argv = bench_serving_argv("http://10.0.0.5:30000/", s, concurrency=8, output_file="/tmp/o.jsonl", seed=3)
    assert argv == [
        "python3", "-m", "sglang.bench_serving", "--backend", "sglang-oai-chat",
        "--base-url", "http://10.0.0.5:30000", "--dataset-name", "random-ids",
        "--random-input-len", "1024", "--random-output-len", "256", "--random-range-ratio", "1.0",
        "--num-prompts", "16", "--max-concurrency", "8", "--request-rate", "inf",
        "--warmup-requests", "2", "--seed", "3", "--output-file", "/tmp/o.jsonl",
    ]  # fmt: skip
    gen = bench_serving_argv(
        "http://h:1", BenchConfig(api="generate"), concurrency=1, output_file="o", request_rate=2
    )
    assert gen[gen.index("--backend") + 1] == "sglang" and gen[gen.index("--request-rate") + 1] == "2.0"
    with pytest.raises(ValueError, match="URL"):
        bench_serving_argv("http://h:1; rm -rf /", s, concurrency=1, output_file="o")
    with pytest.raises(ValueError, match="plain paths"):
        bench_serving_argv("http://h:1", s, concurrency=1, output_file="$(reboot)")


def test_parse_real_result_shape():
    text = "old line from an earlier run\n" + real_line() + "\n"
    level, info = parse_bench_serving(text, concurrency=8, num_prompts=16)
    assert (level.max_concurrency, level.completed, level.failed, level.request_rate) == (8, 16, 0, None)
    assert level.output_throughput == 1024.0 and level.mean_ttft_ms == 150.0 and level.p99_itl_ms == 31.5
    assert level.total_output_tokens == 4096 and level.duration == 4.0 and level.ok
    assert info == {"version": "0.5.23", "tp_size": 4}


def test_parse_failures_give_missing_numbers():
    level, _ = parse_bench_serving(real_line(completed=0), concurrency=8, num_prompts=16)
    assert level.failed == 16 and level.output_throughput is None and level.mean_ttft_ms is None
    assert not level.ok and level.errors
    with pytest.raises(BenchServingError, match="empty"):
        parse_bench_serving("", concurrency=1, num_prompts=1)
    with pytest.raises(BenchServingError, match="not JSON"):
        parse_bench_serving("{oops", concurrency=1, num_prompts=1)


STAND_IN = """#!{python}
# Stands in for `python -m sglang.bench_serving` (needs GPUs' torch stack): writes one result line.
import json, sys
a = sys.argv
out = a[a.index("--output-file") + 1]
c = int(a[a.index("--max-concurrency") + 1])
if c == {fail_at}:
    sys.stderr.write("Traceback ...\\nConnectionRefusedError: [Errno 111] Connect call failed\\n")
    sys.exit(1)
line = {line!r}.replace('"max_concurrency": 8', '"max_concurrency": %d' % c)
open(out, "a").write(line + "\\n")
"""


def test_run_sweep_through_transport(tmp_path):
    import sys

    script = tmp_path / "python"
    script.write_text(STAND_IN.format(python=sys.executable, fail_at=16, line=real_line()))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    s = BenchConfig(concurrency=[1, 8, 16])
    result = asyncio.run(
        run_sweep_sglang(
            LocalTransport(), "http://127.0.0.1:9", s, python=str(script), remote_dir=str(tmp_path)
        )
    )
    assert result.backend == "sglang" and result.server_info["version"] == "0.5.23"
    assert [lv.max_concurrency for lv in result.levels] == [1, 8]
    assert result.partial
    assert "ConnectionRefusedError" in result.errors[0] and "concurrency 16" in result.errors[0]
    assert list(tmp_path.glob("optagent-bench-*")) == []  # result files are removed
