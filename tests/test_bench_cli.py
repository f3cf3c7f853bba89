"""`optagent bench` and `optagent bench compare` end to end against a loopback server."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agent.cli.main import app
from tests.test_bench_sse_server import Behaviour, SSEServer

pytestmark = pytest.mark.server

runner = CliRunner()


def flat(res) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(res.output.split())


SMALL = [
    "--concurrency",
    "1,2",
    "--input-len",
    "4",
    "--output-len",
    "8",
    "--warmup",
    "0",
    "--prompts-per-level",
    "4",
]


def test_bench_sweep_table_json_plot_and_compare(tmp_path):
    a, b, png = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "a.png"
    with SSEServer() as srv:
        res = runner.invoke(
            app,
            [
                "bench",
                "--endpoint",
                srv.endpoint,
                *SMALL,
                "--reps",
                "3",
                "--json",
                str(a),
                "--plot",
                str(png),
            ],
        )
        assert res.exit_code == 0, res.output
        assert "mean of 3 repetition(s)" in flat(res) and "│ 12/0 │" in flat(res)
        res = runner.invoke(
            app, ["bench", "--endpoint", srv.endpoint, *SMALL, "--reps", "3", "--json", str(b)]
        )
        assert res.exit_code == 0, res.output
    sweeps = json.loads(a.read_text())
    assert len(sweeps) == 3 and [lv["max_concurrency"] for lv in sweeps[0]["levels"]] == [1, 2]
    assert sweeps[0]["settings"]["output_len"] == 8 and not sweeps[0]["partial"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = runner.invoke(app, ["bench", "compare", str(a), str(b), "--json"])
    assert res.exit_code == 0, res.output
    decision = json.loads(res.output)
    assert decision["verdict"] in ("no_change", "inconclusive", "improved", "regressed")
    assert len(decision["per_level"]) == 2 and decision["objective"]["metrics"] == ["output_throughput"]
    res = runner.invoke(app, ["bench", "compare", str(a), str(b), "--goal", "p99 ttft at concurrency 2"])
    assert res.exit_code == 0 and "p99_ttft_ms at concurrency 2" in flat(res)
    other = json.loads(b.read_text())
    for s in other:
        s["settings"]["output_len"] = 999
    b.write_text(json.dumps(other))
    res = runner.invoke(app, ["bench", "compare", str(a), str(b)])
    assert res.exit_code == 2, res.output
    assert "cannot compare" in flat(res) and "output_len 8" in flat(res) and "vs 999" in flat(res)


def test_bench_unreachable_exits_1_and_saves_partial(tmp_path):
    with SSEServer() as srv:
        endpoint = srv.endpoint
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["bench", "--endpoint", endpoint, *SMALL, "--reps", "1", "--json", str(out)])
    assert res.exit_code == 1
    assert f"cannot reach {endpoint}: nothing was measured; is the server running?" in flat(res)
    assert "partial result" not in flat(res) and len(res.stderr.strip().splitlines()) <= 2
    saved = json.loads(out.read_text())
    assert saved["partial"] and saved["levels"] == []


def test_bench_http_errors_exit_1_with_cause(tmp_path):
    with SSEServer(Behaviour(status=503)) as srv:
        res = runner.invoke(app, ["bench", "--endpoint", srv.endpoint, *SMALL, "--reps", "1"])
    assert res.exit_code == 1 and "HTTP 503" in flat(res)


def test_bench_bad_input_exits_2(tmp_path):
    res = runner.invoke(app, ["bench", "--endpoint", "http://127.0.0.1:9", "--concurrency", "1,x"])
    assert res.exit_code == 2
    res = runner.invoke(app, ["bench", "--endpoint", "http://127.0.0.1:9", "--concurrency", "0"])
    assert res.exit_code == 2 and "concurrency" in flat(res)
    res = runner.invoke(app, ["bench", "--endpoint", "ftp://x"])
    assert res.exit_code == 2 and "http://" in flat(res)
    res = runner.invoke(app, ["bench", "compare", str(tmp_path / "nope.json"), str(tmp_path / "nope.json")])
    assert res.exit_code == 2 and "no such file" in flat(res)
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": 1}')
    res = runner.invoke(app, ["bench", "compare", str(junk), str(junk)])
    assert res.exit_code == 2 and "not a benchmark result" in flat(res)


def test_bench_defaults_to_the_simulated_deployment(tmp_path, monkeypatch):
    from sim import host
    from tests.fixtures.sim import free_port

    monkeypatch.chdir(tmp_path)
    sim_dir = tmp_path / ".optagent" / "sim"
    host.create(sim_dir, scenario="seed", port=free_port(), time_scale=0.01)
    try:
        args = ["bench", "--concurrency", "1,4", "--input-len", "16", "--output-len", "8", "--reps", "1"]
        res = runner.invoke(app, [*args, "--json", "r.json"])
        assert res.exit_code == 0, res.output
        saved = json.loads((tmp_path / "r.json").read_text())
        assert saved["endpoint"] == (sim_dir / "endpoint").read_text().strip()
        assert saved["server_info"]["served_model_name"] == "qwen3.5-122b"
    finally:
        host.down(sim_dir)


def test_bench_with_sglang_backend_from_config(tmp_path):
    import stat
    import sys

    from tests.test_bench_sglang import STAND_IN, real_line

    script = tmp_path / "python"
    script.write_text(STAND_IN.format(python=sys.executable, fail_at=-1, line=real_line()))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    config = tmp_path / "optagent.toml"
    config.write_text(
        f'[target]\nendpoint = "http://127.0.0.1:9"\npython = "{script}"\n'
        '[bench]\nbackend = "sglang"\nconcurrency = [1, 8]\nreps = 2\n'
    )
    res = runner.invoke(app, ["bench", "--config", str(config), "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    sweeps = json.loads((tmp_path / "r.json").read_text())
    assert [s["backend"] for s in sweeps] == ["sglang", "sglang"]
    assert [lv["max_concurrency"] for lv in sweeps[0]["levels"]] == [1, 8]
    assert sweeps[0]["levels"][0]["output_throughput"] == 1024.0


def test_bench_bad_prompt_file_exits_2(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text("{nope\n")
    # wide enough that the temporary path (longer under pytest-xdist) does not wrap inside "p.jsonl:1"
    res = runner.invoke(
        app, ["bench", "--endpoint", "http://127.0.0.1:9", "--prompt-file", str(bad)], env={"COLUMNS": "400"}
    )
    assert res.exit_code == 2 and "p.jsonl:1" in flat(res)


def test_bench_workload_multiturn_shows_each_turn_and_waits_for_answers(sim_server, tmp_path, monkeypatch):
    """`--workload multiturn`: a table per turn of the conversations (cache hits `missing` where the
    server reports none: the OpenAI route without --enable-cache-report), and each conversation is
    closed-loop: 2 conversations never have more than 2 requests in flight at concurrency 4."""
    monkeypatch.chdir(tmp_path)
    srv = sim_server("seed")
    args = ["bench", "--endpoint", srv.endpoint, "--workload", "multiturn", "--concurrency", "4",
            "--prompts-per-level", "2", "--warmup", "0", "--reps", "1", "--json", "r.json"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    # the 5th turn of bench_multiturn's default shape: 512 tokens, then 64 + 512 a turn
    assert "per turn of the conversations" in flat(res) and "│ 4 │ 5 │ 2816 │ missing │" in flat(res)
    saved = json.loads((tmp_path / "r.json").read_text())
    level = saved["levels"][0]
    assert saved["settings"]["workload"] == "multiturn" and level["completed"] == 10
    assert [t["turn"] for t in level["turns"]] == [0, 1, 2, 3, 4] and level["cache_hit_rate"] is None
    events = sorted(
        (t, step) for r in level["requests"]
        for t, step in ((r["start_s"], 1), (r["start_s"] + r["e2e_ms"] / 1000, -1))
    )  # fmt: skip
    # an answer and the turn it lets go at the same instant: the answer first (-1 sorts first)
    in_flight = [sum(step for _, step in events[: i + 1]) for i in range(len(events))]
    assert max(in_flight) == 2
    res = runner.invoke(app, ["bench", "--endpoint", srv.endpoint, "--workload", "multi-turn"])
    assert res.exit_code == 2
