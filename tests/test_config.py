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


def test_relative_local_paths_are_anchored_at_the_config_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "optagent.toml").write_text(
        "[target]\nlocal_unit = 'units/sglang.service'\nstate_dir = '.state'\nremote_unit = 'rel/on/host'\n"
        "[agent]\ntranscripts_dir = 'tx'\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(tmp_path / "optagent.toml")
    assert cfg.target.local_unit == tmp_path / "units" / "sglang.service"
    assert cfg.target.state_dir == tmp_path / ".state"
    assert cfg.agent.transcripts_dir == tmp_path / "tx"
    assert cfg.target.remote_unit == "rel/on/host"  # a host path stays as the host resolves it


def test_errors_with_brackets_are_printed_not_parsed_as_markup(tmp_path: Path) -> None:
    bad = tmp_path / "[odd]" / "optagent.toml"
    result = CliRunner().invoke(app, ["status", "--config", str(bad)])
    assert result.exit_code == 2
    assert "[odd]" in result.output and "no such config file" in result.output
