"""A damaged `counters.json` never resets the daily restart budget (issue 52, smaller item).

The file counts the restarts optagent caused on a target in the last 24 hours. Once damaged (not
JSON, deeply nested, numbers out of range, the wrong shape) it cannot say how many there were: it is
set aside as `counters.unreadable-<sha>.json` with a message, and the day's budget counts as spent
(never as zero) until the user deletes the file on purpose. Over a real sshd, against the simulated
server; `status` and a rollback still work, a deploy is refused before anything restarts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.test_deploy import cli, healthy, pid_of
from tools.deploy.journal import Journal
from tools.deploy.limits import check_limits
from tools.deploy.outcome import DeployError

DAMAGES = [
    b'{"restarts": [' + b"9" * 4000 + b'], "failures": []}',  # an integer too large for a float
    b"{" * 100_000,  # nested too deep to parse
    b'{"restarts": "often", "failures": {"a": 1}}\n',  # the wrong shape
    b'{"restarts": [1700000000.0, -5], "failures": []}\n',  # a time out of range
    b"\xff\xfe not text",
]


@pytest.mark.parametrize("data", DAMAGES, ids=["huge-int", "deep", "shape", "range", "not-utf8"])
def test_a_damaged_counters_file_counts_as_the_day_s_budget_spent(tmp_path: Path, data: bytes) -> None:
    from tools.config import TargetConfig

    journal = Journal(tmp_path)
    journal.counters_path.write_bytes(data)
    target = TargetConfig(max_restarts_per_day=200)
    with pytest.raises(DeployError, match=r"counts as spent for 24\.0 h more"):
        check_limits(journal, target)
    kept = list(tmp_path.glob("counters.unreadable-*.json"))
    assert [k.read_bytes() for k in kept] == [data]
    with pytest.raises(DeployError, match="damaged"):  # still so for the next command
        check_limits(journal, target)
    journal.record(restart=True)  # a rollback's restart is counted, the mark stays
    assert len(journal.counters()["damaged"]) == 1 and len(journal.counters()["restarts"]) == 1
    journal.counters_path.unlink()  # the user's deliberate reset
    check_limits(journal, target)


def test_over_ssh_the_budget_holds_and_status_says_why(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    state = Path(sim.target.state_dir)
    first = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    (state / "counters.json").write_bytes(b'{"restarts": [' + b"9" * 4000 + b"]}")
    before = pid_of(sim.sim_dir)

    status = cli("status", "--json", config=sim.config_path)
    assert status.returncode == 0, status.stdout + status.stderr
    info = json.loads(status.stdout)
    assert info["restarts_last_day"].startswith("unknown:") and "counts as spent" in info["restarts_last_day"]

    deploy = cli("deploy", "--set", "mem-fraction-static=0.81", "--yes", config=sim.config_path, timeout=120)
    message = " ".join((deploy.stdout + deploy.stderr).split())
    assert deploy.returncode == 1 and "Traceback" not in message, message
    assert "restart counters of this target" in message and "Nothing was changed" in message, message
    assert pid_of(sim.sim_dir) == before and healthy(sim.target.endpoint)  # nothing restarted
    assert "--mem-fraction-static 0.8 " in Path(sim.target.remote_unit).read_text()
    assert any(p.name.startswith("counters.unreadable-") for p in state.iterdir())

    (state / "counters.json").unlink()  # what the message says to do, knowing the host had few
    started = time.monotonic()
    deploy = cli("deploy", "--set", "mem-fraction-static=0.81", "--yes", config=sim.config_path, timeout=120)
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    assert time.monotonic() - started < 90 and healthy(sim.target.endpoint)
