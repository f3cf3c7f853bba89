"""A whole `optagent run` ends within its wall-time budget (+5%), with known-good serving: a budget
that holds trials, one too small for the baseline, one too small for research's whole list."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

MINUTES = 2.0


def write_config(cfg, tmp_path: Path, bench: list[str], agent: tuple[str, ...] = ()) -> Path:  # type: ignore[no-untyped-def]
    """An optagent.toml for the simulated host `cfg`, its benchmark set by `bench` lines."""
    t = cfg.target
    lines = ["[target]"]
    lines += [f"{k} = {json.dumps(str(getattr(t, k)))}" for k in ("local_unit", "remote_unit", "endpoint")]
    lines += [f"{k} = {json.dumps(str(getattr(t, k)))}" for k in ("run_dir", "state_dir", "nvidia_smi")]
    lines += ['transport = "local"', 'service_manager = "process"']
    lines += ["[agent]", f"transcripts_dir = {json.dumps(str(tmp_path / 'tx'))}", *agent]
    lines += ["[bench]", *bench]
    config = tmp_path / "optagent.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def run(config: Path, minutes: float) -> tuple[subprocess.CompletedProcess, float]:
    """`optagent run --json --max-minutes minutes` as a user runs it, and its wall seconds."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", "from agent.cli.main import app; app()", "run", "--config", str(config),
         "--yes", "--json", "--max-minutes", str(minutes)],
        capture_output=True, text=True, timeout=600, cwd=config.parent,
    )  # fmt: skip
    return done, time.monotonic() - started


def on_known_good(cfg) -> None:  # type: ignore[no-untyped-def]
    """The server serves, and runs what the local unit file says: no relaunch or candidate left."""
    t = cfg.target
    assert httpx.get(t.endpoint + "/health", timeout=5).status_code == 200
    deployed = Path(t.remote_unit).read_text()
    assert deployed == Path(t.local_unit).read_text()
    assert "optagent: a relaunch" not in deployed


def events(tmp_path: Path) -> list[dict]:
    (path,) = (tmp_path / "tx").glob("*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module", autouse=True)
def warm_cache(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """What a run builds once per version (the code index, the start-up check's venv), built before
    any clock starts: these tests time the budget, not a first build, which a run refuses to start
    when the budget cannot hold it (the last test)."""
    from tools.research.index import load_index
    from tools.research.startup.resolver import worker_python

    load_index(sglang_0523)
    worker_python(sglang_0523)


def test_a_run_ends_within_its_budget_with_the_server_healthy(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from sim.host import ensure_up

    # a clock four times as fast as the seed's GPUs: a trial takes ~30 s here, so the playbook's
    # candidates need several times the 2 minutes given and the budget decides where the run stops
    cfg = sim_host(time_scale=0.25)
    ensure_up(tmp_path / "sim")
    config = write_config(cfg, tmp_path, ["concurrency = [1, 8]", "input_len = 256", "output_len = 64",
                                          "warmup = 0", "reps = 2", "time_scale = 0.25"])  # fmt: skip
    done, took = run(config, MINUTES)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert took <= MINUTES * 60 * 1.05, (took, summary["budget"])  # the whole process, start-up included
    assert "budget" in summary["budget"] and summary["restarts"] >= 2  # it ran trials, then stopped
    assert summary["status"].startswith("budget spent"), summary[
        "status"
    ]  # the budget, not the list, ended it
    on_known_good(cfg)


def test_a_budget_too_small_for_the_baseline_stops_before_it(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from sim.host import ensure_up

    # the simulated deployment's own benchmark (levels 1, 8, 64, 3 repetitions) on its default clock:
    # ~45 s of baseline, where one request alone already decodes its tokens in ~20 s
    cfg = sim_host(time_scale=0.5)
    ensure_up(tmp_path / "sim")
    config = write_config(cfg, tmp_path, ["concurrency = [1, 8, 64]", "output_len = 128", "warmup = 1",
                                          "reps = 3", "time_scale = 0.5"])  # fmt: skip
    done, took = run(config, 0.5)
    assert took <= 0.5 * 60 * 1.05, (took, done.stderr[-2000:])
    assert done.returncode == 1, done.stderr[-3000:]
    said = " ".join(done.stderr.split())
    assert "the baseline was not started: its 3 repetitions of concurrency 1, 8, 64 need at least" in said, (
        said
    )
    enough = int(re.search(r"--max-minutes (\d+) would hold them", said).group(1))
    assert enough >= 2, said  # more than the 0.5 given, and at least what the baseline and the end take
    assert "nothing was changed" in said
    on_known_good(cfg)
    got = events(tmp_path)
    assert not [e for e in got if e.get("kind") == "baseline"]  # not a repetition was measured
    end = next(e for e in got if e.get("type") == "end")
    assert end["outcome"]["status"].startswith("budget spent: the baseline was not started")


def test_a_budget_that_cuts_research_short_still_holds(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from sim.host import ensure_up

    # a baseline of ~4 s fits 0.55 min with the end's 20 s kept; research, one flag at a time here
    # (each ~1-4 s on two cores), does not: the deadline stops it between flags
    cfg = sim_host(time_scale=0.25)
    ensure_up(tmp_path / "sim")
    config = write_config(
        cfg, tmp_path, ["concurrency = [1, 8]", "input_len = 256", "output_len = 64", "warmup = 0",
                        "reps = 2", "time_scale = 0.25"], ("max_parallel_research = 1",),
    )  # fmt: skip
    minutes = 0.55
    done, took = run(config, minutes)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert took <= minutes * 60 * 1.05, (took, summary["budget"])
    unresearched = [
        c for c, why in summary["untried"].items() if why.startswith("not researched: wall-time budget")
    ]
    assert unresearched, summary["untried"]
    assert summary["status"].startswith("budget spent"), summary["status"]
    # the budget line is true: the minutes the process took, and spent
    used = float(re.search(r"([\d.]+) min used", summary["budget"]).group(1))
    assert abs(used - took / 60) <= 0.1 and "; spent: " in summary["budget"], (took, summary["budget"])
    on_known_good(cfg)
    got = events(tmp_path)
    assert [e for e in got if e.get("kind") == "baseline"]  # the baseline was measured whole
    verdicts = {e["data"]["flag"] for e in got if e.get("kind") == "verdict"}
    skipped = {e["data"]["flag"] for e in got if e.get("kind") == "not_researched"}
    assert skipped and not verdicts & skipped  # a flag has its whole verdict or none
    assert all(c.split()[0] in skipped for c in unresearched)


def test_a_budget_too_small_for_a_first_code_index_stops_before_building_it(
    sim_host, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from sim.host import ensure_up
    from tests.fixtures.sglang_src import synthetic_tree
    from tests.test_research_index import FILES

    # an empty optagent cache (this process's environment, which the command inherits): the version's
    # code index is not built, and a build (~2 min) does not fit the half minute given
    tree = synthetic_tree(tmp_path / "tree", monkeypatch, FILES, "9.9.9")
    cache = Path(os.environ["OPTAGENT_CACHE_DIR"])
    cfg = sim_host(time_scale=0.5)
    ensure_up(tmp_path / "sim")
    config = write_config(cfg, tmp_path, ["concurrency = [1]", "reps = 1"])
    config.write_text(config.read_text() + f"[research]\nsource_dir = {json.dumps(str(tree.root))}\n")
    done, took = run(config, 0.5)
    assert took <= 0.5 * 60 * 1.05, (took, done.stderr[-2000:])
    assert done.returncode == 1, done.stderr[-3000:]
    said = " ".join(done.stderr.split())
    assert "research needs the code index of SGLang" in said and "built once for this version" in said, said
    enough = int(re.search(r"--max-minutes (\d+) would hold the build", said).group(1))
    assert enough >= 3, said  # the build's ~150 s and the end, past the half minute given
    assert "nothing was changed" in said
    assert not list(cache.glob("flag-index/*.sqlite"))  # nothing was built
    on_known_good(cfg)
    got = events(tmp_path)
    assert not [e for e in got if e.get("kind") == "baseline"]
    end = next(e for e in got if e.get("type") == "end")
    assert end["outcome"]["status"].startswith("budget spent: research needs the code index")
