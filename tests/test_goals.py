"""Goals: the objective is printed with the words that chose it, length hints set the benchmark,
and a goal that names no objective is refused with goals that work (not silently throughput)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_run_json import _config_file
from tools.bench.objective import GoalError, read_goal

ROOT = Path(__file__).parents[1]
CLI = [sys.executable, "-c", "from agent.cli.main import app; app()"]


def test_goal_words_choose_the_objective_and_the_lengths() -> None:
    goal = read_goal("make latency better for long prompts")
    assert goal.objective.kind == "latency" and goal.objective.words == "latency"
    assert (goal.lengths, goal.length_words) == ({"input_len": 4096}, "long prompts")
    both = read_goal("short answers, long context", strict=False)  # lengths alone name no objective
    assert both.lengths == {"output_len": 32, "input_len": 4096}
    assert read_goal("p99 ttft at concurrency 8").objective.words == "p99 ttft ... at concurrency 8"
    default = read_goal("").objective  # no goal: the default
    assert default.words == "" and default.kind == "throughput"
    for goal in ("reduce cost", "make it better", "x"):
        with pytest.raises(GoalError, match="name throughput or latency, e.g. 'improve throughput'"):
            read_goal(goal)
        assert read_goal(goal, strict=False).objective.kind == "throughput"  # a saved goal is read as it was


def test_run_refuses_a_goal_it_cannot_map_before_touching_anything(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    t = sim_host().target  # laid out, never started: the refusal comes first
    config = tmp_path / "optagent.toml"
    config.write_text(f"[target]\nlocal_unit = {json.dumps(str(t.local_unit))}\n"
                      f"remote_unit = {json.dumps(str(t.remote_unit))}\nendpoint = {json.dumps(t.endpoint)}\n")  # fmt: skip
    done = subprocess.run([*CLI, "run", "--goal", "reduce cost", "--config", str(config), "--yes"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "cannot tell what to optimize from 'reduce cost'" in " ".join(done.stderr.split())


def test_run_prints_the_objective_and_the_words_that_chose_it(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = _config_file(sim_host, tmp_path)
    done = subprocess.run(
        [*CLI, "run", "--config", str(config), "--dry-run", "--json", "--goal", "make latency better for long prompts"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = " ".join(done.stderr.split())
    assert ("objective: median TTFT and TPOT at the lowest concurrency (from 'latency'); "
            "benchmark input 4096 tokens (from 'long prompts')") in said  # fmt: skip
    transcript = Path(json.loads(done.stdout)["transcript"])
    baseline = next(
        json.loads(line) for line in transcript.read_text().splitlines() if '"kind": "baseline"' in line
    )
    assert baseline["data"]["reps"][0]["settings"]["input_len"] == 4096


def test_a_level_the_goal_names_is_added_to_the_benchmark(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tools.bench.objective import unmeasured_levels

    at_16 = read_goal("maximize output throughput at concurrency 16").objective
    assert unmeasured_levels(at_16, [1, 8]) == [16]
    assert unmeasured_levels(read_goal("p99 ttft at concurrency 8").objective, [1, 8]) == []
    limit = read_goal("improve throughput keeping p99 TTFT under 500 ms at concurrency 32").objective
    assert unmeasured_levels(limit, [1, 8]) == [32]  # the limit's level is judged too
    config = _config_file(sim_host, tmp_path)  # its benchmark measures concurrency 1 and 8
    done = subprocess.run(
        [*CLI, "run", "--config", str(config), "--dry-run", "--json", "--goal", "p99 ttft at concurrency 16"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "benchmark adds concurrency 16 (the goal names it)" in " ".join(done.stderr.split())
    transcript = Path(json.loads(done.stdout)["transcript"])
    baseline = next(
        json.loads(line) for line in transcript.read_text().splitlines() if '"kind": "baseline"' in line
    )
    assert sorted(int(c) for c in baseline["data"]["output_tok_s"]) == [1, 8, 16]


def test_a_baseline_that_breaks_the_goal_s_limit_is_said_at_once(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = _config_file(sim_host, tmp_path)
    goal = "improve throughput keeping p99 TTFT under 1 ms"  # no server answers that fast
    done = subprocess.run([*CLI, "run", "--config", str(config), "--dry-run", "--json", "--goal", goal],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = " ".join(done.stderr.split())
    assert "the baseline breaks the goal's limit: p99_ttft_ms at concurrency 1 is" in said
    assert "above the limit of 1 ms; where it does, a change is judged by the objective alone" in said


def test_a_user_s_tokens_per_second_is_the_time_per_output_token() -> None:
    for goal, level in [("maximize tokens per second per user at concurrency 64", [64]),
                        ("tps per user at concurrency 8", [8]), ("improve per-user throughput", None)]:  # fmt: skip
        objective = read_goal(goal).objective
        assert objective.metrics == ["median_tpot_ms"] and objective.levels == level, goal
        assert not objective.higher_is_better and "1000 / TPOT" in objective.description
    # the server's total is still throughput
    total = read_goal("maximize output throughput at concurrency 64").objective
    assert total.metrics == ["output_throughput"]
