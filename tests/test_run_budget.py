"""`optagent run`'s wall-time budget: --max-minutes, agent.max_minutes, the simulated default."""

from __future__ import annotations

from typer.testing import CliRunner

from agent.cli.main import app
from agent.cli.run import SIM_WALL_MINUTES, budget_minutes
from tools.config import Config


def test_budget_option_then_config_then_default():
    cfg = Config()
    assert budget_minutes(cfg, None, simulated=True) == SIM_WALL_MINUTES == 10.0
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
