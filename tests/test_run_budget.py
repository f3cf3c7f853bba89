"""`optagent run`'s wall-time budget: --max-minutes, agent.max_minutes, the simulated default."""

from __future__ import annotations

from typer.testing import CliRunner

from agent.cli.main import app
from agent.cli.run import SIM_WALL_MINUTES, budget_minutes
from tools.config import Config


def test_budget_option_then_config_then_default():
    cfg = Config()
    assert budget_minutes(cfg, None, simulated=True) == SIM_WALL_MINUTES == 15.0
    assert budget_minutes(cfg, None, simulated=False) == cfg.agent.max_wall_minutes
    cfg.agent.max_minutes = 25.0
    assert budget_minutes(cfg, None, simulated=True) == 25.0
    assert budget_minutes(cfg, 3.5, simulated=True) == 3.5


def test_config_file_accepts_max_minutes(tmp_path):
    import tomllib

    from tools.config import AgentConfig

    text = "max_minutes = 42\n"
    assert AgentConfig.model_validate(tomllib.loads(text)).max_minutes == 42


def test_non_positive_max_minutes_is_bad_usage():
    result = CliRunner().invoke(app, ["run", "--max-minutes", "0"])
    assert result.exit_code == 2 and "--max-minutes must be more than 0" in result.output


def test_restart_budget_given_else_half_a_one_at_a_time_grid():
    import tomllib

    from agent.policy.playbook import PLAYBOOK_PATH, grid_size, load_playbook
    from agent.prepare import restart_budget
    from tools.config import AgentConfig

    playbook = load_playbook(PLAYBOOK_PATH)
    facts = {"server.tp_size": 2, "gpu.sm": 90, "model.is_moe": True, "model.experts_per_tok": 8}
    levers = grid_size(playbook, facts)
    assert 8 < levers <= len(playbook)
    # a lever set already is not in the grid
    flag = playbook[0].flag.lstrip("-").replace("-", "_")
    assert grid_size(playbook, {**facts, f"flag.{flag}": playbook[0].value or True}) == levers - 1
    assert restart_budget(None, levers) == levers  # half of deploying and rolling back each
    assert restart_budget(None, 3) == 8  # a short playbook: two trials' worth
    assert restart_budget(5, levers) == 5
    # the relaunches that measure the launch spread (none when the spread is recorded) are spent
    # from the same budget (see test_spread_relaunches_come_out_of_the_budget)
    from agent.trial.spread import spread_restarts
    from tools.config import BenchConfig

    assert spread_restarts(BenchConfig()) == 2 and spread_restarts(BenchConfig(spread_launches=3)) == 4
    assert spread_restarts(BenchConfig(launch_spread=0.02, launch_spread_df=4)) == 0
    assert AgentConfig.model_validate(tomllib.loads("max_restarts = 9\n")).max_restarts == 9
    result = CliRunner().invoke(app, ["run", "--max-restarts", "-1"])
    assert result.exit_code == 2 and "--max-restarts must be 0 or more" in result.output


def test_the_first_trial_starts_only_if_a_winner_fits_at_this_runs_measured_speed():
    import time

    from agent.trial.record import Baseline
    from agent.trial.runner import TrialRunner
    from tests.transcript_sessions import sweep
    from tools.bench.objective import objective_from_goal
    from tools.bench.results import SweepResult
    from tools.config import BenchConfig
    from tools.deploy.deployment import DeployOutcome

    def rep(start: int) -> SweepResult:  # one repetition that took 29 s, as on the seed deployment
        data = sweep({1: 124.0, 8: 410.0, 64: 1150.0})
        data |= {"started_at": f"2026-12-03T14:24:{start:02d}+00:00",
                 "finished_at": f"2026-12-03T14:{24 + (start + 29) // 60}:{(start + 29) % 60:02d}+00:00"}  # fmt: skip
        return SweepResult.model_validate(data)

    baseline = Baseline(reps=[rep(0), rep(29), rep(1)], probe=None, text="")
    runner = TrialRunner(deployment=None, endpoint="http://127.0.0.1:1", bench=BenchConfig(reps=3),
                         objective=objective_from_goal("improve throughput"), baseline=baseline)  # fmt: skip
    # known-good, candidate, known-good, confirm; 3 restarts (deploy, rollback, the second launch),
    # each as long as a repetition while no restart has been timed
    assert runner.trial_estimate() == (4 * 3 + 3) * 29
    runner.deadline = time.monotonic() + 400  # under 7 minutes left: a winner could not finish
    assert runner.budget_left() == "wall-time budget spent"
    runner.deadline = time.monotonic() + 500
    assert runner.budget_left() is None
    # the restart spread's launches took 80 s each: a winner's three restarts take as long
    for _ in range(2):
        runner.note_restart(DeployOutcome(ok=True, seconds=80.0))
    assert runner.trial_estimate() == 4 * 3 * 29 + 3 * 80
    assert runner.budget_left() == "wall-time budget spent"
