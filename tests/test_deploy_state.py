"""Damaged state never crashes a command: it is kept aside under a new name and recovered from
(issue 27, item 5). Deeply nested JSON, a huge integer, non-UTF-8 and oversized files in the local
state dir, then `optagent status` and `optagent deploy` over a real sshd to the simulated server."""

from __future__ import annotations

from pathlib import Path

from tests.test_deploy import cli, healthy
from tools.deploy.journal import MAX_STATE_BYTES, Journal


def test_damaged_state_files_are_set_aside_and_commands_go_on(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    state = Path(sim.target.state_dir)
    first = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path, timeout=120)
    assert first.returncode == 0, first.stderr  # known-good and counters exist now
    damages = [
        ("journal.json", b"[" * 100_000 + b"]" * 100_000, "journal.unreadable-"),  # RecursionError
        # (damaged restart counters stop deploys for a day: tests/test_deploy_counters.py)
        ("known-good.service", b"[Service]\nExecStart=/bin/\xff\xfe sglang\n", "known-good.unreadable-"),
        ("known-good.service", b"#" * (MAX_STATE_BYTES + 10), "known-good.unreadable-"),
        ("journal.json", b"\xff" * (MAX_STATE_BYTES + 10), "journal.unreadable-"),
    ]
    for i, (name, data, aside) in enumerate(damages):
        (state / name).write_bytes(data)
        status = cli("status", config=sim.config_path, timeout=120)
        output = status.stdout + status.stderr
        assert status.returncode == 0 and "Traceback" not in output, (name, output[-2000:])
        value = f"0.8{i}"
        deploy = cli(
            "deploy", "--set", f"mem-fraction-static={value}", "--yes", config=sim.config_path, timeout=120
        )
        output = deploy.stdout + deploy.stderr
        assert deploy.returncode == 0 and "Traceback" not in output, (name, output[-2000:])
        assert f"--mem-fraction-static {value}" in " ".join(Path(sim.target.remote_unit).read_text().split())
        if aside is not None:
            kept = [p for p in state.iterdir() if p.name.startswith(aside)]
            assert kept and any(p.read_bytes() == data for p in kept), (name, sorted(state.iterdir()))
    assert healthy(sim.target.endpoint)
    journal = Journal(state)
    assert journal.read() is None and journal.known_good() == Path(sim.target.remote_unit).read_text()
