"""`optagent bench --restarts N` against a real simulated host: known-good relaunched through the
deployment gate, the launch spread recorded in the config file, and a run then using the figure
without relaunching (agent/cli/bench_spread.py, agent/trial/spread.py)."""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from agent.cli.main import app

pytestmark = pytest.mark.slow(seconds=60)

runner = CliRunner()
SMALL = ["--concurrency", "1,4", "--input-len", "64", "--output-len", "16", "--prompts-per-level", "8",
         "--warmup", "0", "--reps", "2"]  # fmt: skip


def flat(res) -> str:  # type: ignore[no-untyped-def]
    return " ".join(res.output.split())


def write_config(cfg, path: Path) -> str:  # type: ignore[no-untyped-def]
    """An optagent.toml for the simulated host `cfg`, with a comment and a [bench] table of its own."""
    target = "\n".join(f"{k} = {json.dumps(v)}" for k, v in cfg.target.model_dump(mode="json").items()
                       if v is not None)  # fmt: skip
    text = (
        "# my deployment\nsimulated = true\n[target]\n" + target + "\n\n"
        "[bench]\nconcurrency = [1, 8, 64]  # the levels production sees\nreps = 3\n"
    )
    path.write_text(text)
    return text


def deployed(cfg) -> str:  # type: ignore[no-untyped-def]
    return Path(cfg.target.remote_unit).read_text()


@pytest.mark.quiet
def test_restarts_records_the_launch_spread_and_a_run_then_uses_it(sim_host, tmp_path):
    from agent.trial.spread import known_spread, measure_spread
    from sim import host
    from tools.config import load_config

    # at time scale 0.2 the seed streams a few hundred tok/s of wall time: the launches differ by
    # what the simulated restart does (1%), not by what the other test workers take of the two
    # cores (at 0.01, 4,000-12,000 tok/s, launches measured 33% and 132% apart in CI, which
    # `agent.trial.spread.unsteady` now refuses to record)
    cfg = sim_host("seed", time_scale=0.2)
    host.ensure_up(Path(cfg.target.remote_unit).parent)
    before = deployed(cfg)
    path = tmp_path / "optagent.toml"
    original = write_config(cfg, path)
    res = runner.invoke(app, ["bench", "--config", str(path), "--restarts", "3", *SMALL])
    assert res.exit_code == 0, res.output
    out = flat(res)
    assert "launch 4: c=1" in out and "launch 5" not in out  # the running launch and three relaunches
    assert "over 4 launches of known-good (c=1" in out and "3 degrees of freedom; 4 restarts" in out
    # known-good is deployed again (the third relaunch ran the marked copy) and serves
    assert deployed(cfg) == before and httpx.get(cfg.target.endpoint + "/health").status_code == 200
    text = path.read_text()
    assert text.startswith(original.split("reps = 3")[0]) and "# the levels production sees" in text
    bench = tomllib.loads(text)["bench"]
    assert bench["launch_spread_df"] == 3 and 0 < bench["launch_spread"] < 0.1
    assert bench["concurrency"] == [1, 8, 64] and bench["reps"] == 3
    assert f"launch_spread = {bench['launch_spread']:.4f}" in out

    class Untouchable:  # a run's deployment: the recorded figure needs no restart
        async def deploy(self, *a, **k):  # type: ignore[no-untyped-def]
            raise AssertionError("relaunched although a spread is recorded")

        rollback = deploy

    from agent.trial.record import Baseline
    from agent.trial.runner import TrialRunner
    from tools.bench.objective import objective_from_goal

    loaded = load_config(path)
    run = TrialRunner(
        deployment=Untouchable(), endpoint=cfg.target.endpoint, bench=loaded.bench,
        objective=objective_from_goal(None), baseline=Baseline(reps=[], probe=None, text=before),
    )  # fmt: skip
    run.reference = [object()]  # a baseline block was measured
    spread = asyncio.run(measure_spread(run))
    assert spread.source == "recorded" == known_spread(loaded.bench).source and run.restarts == 0
    assert run.launch_prior == (bench["launch_spread"], 3)
    assert "recorded by `optagent bench --restarts` (3 degrees of freedom)" in spread.describe()


def test_bad_restarts_input_exits_2_before_any_restart(sim_host, tmp_path):
    cfg = sim_host("seed", time_scale=0.01)  # laid out, not started: nothing may reach it
    path = tmp_path / "optagent.toml"
    original = write_config(cfg, path)
    for args, words in [
        (["--restarts", "1"], "--restarts must be at least 2, got 1"),
        (["--restarts", "0"], "--restarts must be at least 2, got 0"),
        (["--restarts", "2", "--reps", "1"], "at least 2 repetitions per launch"),
        (["--restarts", "2", "--endpoint", "http://127.0.0.1:9"], "--endpoint cannot be used with it"),
    ]:
        res = runner.invoke(app, ["bench", "--config", str(path), *args], env={"COLUMNS": "300"})
        assert res.exit_code == 2 and words in flat(res), res.output
    assert path.read_text() == original


def test_a_failed_relaunch_leaves_known_good_deployed_and_records_nothing(sim_host, tmp_path, monkeypatch):
    from sim import host
    from tools.deploy.deployment import Deployment
    from tools.deploy.health import HealthResult

    cfg = sim_host("seed", time_scale=0.01)
    host.ensure_up(Path(cfg.target.remote_unit).parent)
    before = deployed(cfg)
    path = tmp_path / "optagent.toml"
    original = write_config(cfg, path)
    real_wait, calls = Deployment._wait, []

    async def wait(self):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:  # the third relaunch (the marked copy again) never becomes healthy
            return HealthResult(ok=False, seconds=0.0, reason="timed out waiting for /health")
        return await real_wait(self)

    monkeypatch.setattr(Deployment, "_wait", wait)
    res = runner.invoke(
        app, ["bench", "--config", str(path), "--restarts", "4", *SMALL], env={"COLUMNS": "300"}
    )
    assert res.exit_code == 1, res.output
    out = flat(res)
    assert "launch 3: c=1" in out and "launch 4" not in out
    assert "relaunch 3 failed: timed out waiting for /health" in out and "nothing was recorded" in out
    assert "known-good is deployed (4 restarts)" in out  # 2 relaunches, the failed one, its rollback
    assert path.read_text() == original
    assert deployed(cfg) == before and httpx.get(cfg.target.endpoint + "/health").status_code == 200


@pytest.mark.quiet
def test_on_the_default_simulated_deployment_the_spread_is_measured_and_printed(tmp_path, monkeypatch):
    """No optagent.toml: the simulated deployment in .optagent/sim is relaunched the same way; no
    file names it, so the figure is printed with what to record, and no config file appears."""
    from sim import host
    from tests.fixtures.sim import free_port

    monkeypatch.chdir(tmp_path)
    sim_dir = tmp_path / ".optagent" / "sim"
    # at 0.2, as above: at 0.01 the two cores, not the restart, set the spread (60% in a loaded run)
    host.create(sim_dir, scenario="seed", port=free_port(), time_scale=0.2)
    try:
        res = runner.invoke(app, ["bench", "--restarts", "2", *SMALL], env={"COLUMNS": "300"})
        assert res.exit_code == 0, res.output
        out = flat(res)
        assert "over 3 launches of known-good" in out and "2 degrees of freedom; 2 restarts" in out
        assert "not recorded: the simulated default has no optagent.toml" in out
        assert not (tmp_path / "optagent.toml").exists()
        assert "# optagent:" not in (sim_dir / "sglang.service").read_text()
    finally:
        host.down(sim_dir)
