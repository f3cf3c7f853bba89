from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli.main import app
from tools.config import ConfigError, load_config, sim_config


def test_init_writes_a_config_that_loads(tmp_path: Path) -> None:
    out = tmp_path / "optagent.toml"
    result = CliRunner().invoke(app, ["init", "--path", str(out)])
    assert result.exit_code == 0, result.output
    cfg = load_config(out)
    assert cfg.target.transport == "ssh"
    assert cfg.target.service_manager == "systemd"
    assert cfg.bench.concurrency == [1, 2, 4, 8, 16, 32, 64]
    again = CliRunner().invoke(app, ["init", "--path", str(out)])
    assert again.exit_code == 2


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[target]\nservice_manager = 'upstart'\n", "target.service_manager"),
        ("[target]\nhots = 'x'\n", "target.hots: unknown key"),
        ("[bench]\nconcurrency = [0, 4]\n", "bench.concurrency"),
        ("[target]\nendpoint = 'gpu:30000'\n", "target.endpoint"),
        ("[target\n", "not valid TOML"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert needle in str(info.value)


def test_sim_config_reads_the_endpoint_file(tmp_path: Path) -> None:
    (tmp_path / "endpoint").write_text("http://127.0.0.1:31234\n")
    cfg = sim_config(tmp_path)
    assert cfg.simulated
    assert cfg.target.endpoint == "http://127.0.0.1:31234"
    assert cfg.target.remote_unit == str(tmp_path.resolve() / "sglang.service")
