"""`optagent deploy --set` checks names, types and choices against the running version's catalog first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_deploy import cli, pid_of
from tools.deploy.flagcheck import check_edits
from tools.research.flags import flag_catalog


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "mem-fraction-statc=0.8",
            "--mem-fraction-statc is not a flag of sglang 0.5.23; did you mean --mem-fraction-static",
        ),
        ("attention-backend=trito", "got 'trito' (did you mean triton?)"),
        ("tp-size=four", "--tp-size expects an integer, got 'four'"),
        ("enable-torch-compile=1", "--enable-torch-compile is a switch and takes no value"),
        ("mem-fraction-static", "--mem-fraction-static needs a value"),
    ],
)
def test_a_bad_setting_exits_2_before_any_restart(ssh_sim, setting: str, message: str) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    before, unit = pid_of(sim.sim_dir), Path(sim.target.remote_unit).read_text()
    result = cli("deploy", "--set", setting, "--yes", config=sim.config_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in " ".join(result.stderr.split())
    assert pid_of(sim.sim_dir) == before and Path(sim.target.remote_unit).read_text() == unit
    assert not (sim.sim_dir / "run" / "backups").exists()
    assert not (Path(sim.target.state_dir) / "journal.json").exists()


def test_a_good_setting_still_deploys(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    result = cli("deploy", "--set", "cuda-graph-max-bs-decode=64", "--set", "tensor-parallel-size=4", "--yes",
                 config=sim.config_path)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--cuda-graph-max-bs-decode 64" in Path(sim.target.remote_unit).read_text()


def test_check_edits_against_the_real_catalog(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    catalog = flag_catalog(sglang_0523)
    ok = [("set", "--kv-cache-dtype", "fp8_e4m3"), ("set", "--cuda-graph-bs-decode", "1 2 4"),
          ("set", "--trust-remote-code", None), ("unset", "--tp-size", None)]  # fmt: skip
    assert check_edits(catalog, ok, version="0.5.23") == []
    bad = [
        ("set", "--cuda-graph-bs-decode", "1 two"),
        ("set", "--kv-cache-dtype", "fp9"),
        ("unset", "--tp-sz", None),
    ]
    problems = check_edits(catalog, bad, version="0.5.23")
    assert len(problems) == 3
    assert "expects an integer, got 'two'" in problems[0] and "must be one of auto" in problems[1]
    assert "did you mean --tp-size" in problems[2]
