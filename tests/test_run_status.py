"""`optagent run` reports failed work: the session marks it, the CLI exits 1 (0 only on success)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from agent.session import RunResult, _final
from agent.transcripts.transcript import Transcript
from agent.trial.record import Baseline
from agent.ui import RunUI


@pytest.mark.parametrize(("status", "failed"), [("completed", False), ("planner failed: ValueError", True)])
def test_final_marks_a_failed_planner_as_failed_work(sim_server, tmp_path, status, failed):
    server = sim_server("seed")
    transcript = Transcript.create(tmp_path, kind="run", goal="g", model="builtin", target=server.endpoint)
    ui = RunUI(Console(file=io.StringIO()), transcript)
    config = SimpleNamespace(target=SimpleNamespace(endpoint=server.endpoint))
    baseline = Baseline(reps=[], probe=None, text="")
    result = asyncio.run(_final(ui, config, None, baseline, "conclusion", status, 0.0, 0.0))
    transcript.close({})
    assert result.failed is failed and result.status == status


def _config_file(sim_host, tmp_path: Path) -> Path:
    t = sim_host().target
    lines = ["[target]"]
    lines += [f"{k} = {json.dumps(str(getattr(t, k)))}" for k in ("local_unit", "remote_unit", "endpoint")]
    lines += ["[agent]", f"transcripts_dir = {json.dumps(str(tmp_path / 'tx'))}"]
    path = tmp_path / "optagent.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("failed", "code"), [(False, 0), (True, 1)])
def test_run_exits_1_when_the_work_failed(sim_host, tmp_path, monkeypatch, failed, code):
    import agent.session
    from agent.cli.main import app

    async def fake_session(config, opts, ui):  # the session itself is covered in test_run_e2e
        return RunResult(status="planner failed: boom" if failed else "completed", failed=failed)

    monkeypatch.setattr(agent.session, "run_session", fake_session)
    out = CliRunner().invoke(app, ["run", "--config", str(_config_file(sim_host, tmp_path)), "--yes"])
    assert out.exit_code == code, out.output
    assert ("planner failed: boom" in out.output) is failed
