"""A journal of valid JSON but the wrong shape is treated as unreadable: kept aside, then recovered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_deploy import cli, healthy

pytestmark = pytest.mark.server


@pytest.mark.parametrize(
    "damaged",
    [
        "[1, 2, 3]\n",
        '{"id": 5}\n',
        '{"id": "x", "step": "dance", "candidate_sha": "", "known_good_sha": ""}\n',
        '{"id": "x", "step": "wait", "candidate_sha": "", "known_good_sha": "", "history": "restart"}\n',
    ],
)
def test_a_wrong_shape_journal_is_kept_and_recovered(ssh_sim, damaged: str) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    original = Path(sim.target.remote_unit).read_text()
    killed = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path,
                 env={"OPTAGENT_FAULT_KILL_AT": "healthy"})  # fmt: skip
    assert killed.returncode == -9
    assert "--mem-fraction-static 0.8" in Path(sim.target.remote_unit).read_text()  # the candidate is live
    state = Path(sim.target.state_dir)
    (state / "journal.json").write_text(damaged)
    (state / "counters.json").write_text('{"restarts": "often", "failures": {"a": 1}}\n')

    result = cli("status", config=sim.config_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "restored the known-good configuration after an interrupted deploy (unreadable" in " ".join(
        result.stdout.split()
    )
    assert Path(sim.target.remote_unit).read_text() == original
    assert not (state / "journal.json").exists()
    copies = list(state.glob("journal.unreadable-*.json"))
    assert [c.read_text() for c in copies] == [damaged]
    assert healthy(sim.target.endpoint)
    assert isinstance(json.loads((state / "counters.json").read_text())["restarts"], list)
