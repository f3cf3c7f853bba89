"""A run's final health line comes from a check made when it is printed (issue 52, a smaller item).

In the restart-storm run the last line said `healthy: True` seconds before the server was down: the
check had been made before the final benchmark. Here the server dies during that benchmark (a real
simulated server, killed), and the line, the status and the exit say so.
"""

from __future__ import annotations

import asyncio
import io
import time
from types import SimpleNamespace

import pytest
from rich.console import Console

from agent import session
from agent.ui import RunUI


def test_the_final_health_line_is_checked_when_it_is_written(
    sim_server, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    server = sim_server("seed")
    died: list[bool] = []

    async def final_benchmark_while_the_server_dies(ui, config):  # type: ignore[no-untyped-def]
        server.stop()
        died.append(True)
        return None

    monkeypatch.setattr(session, "_final_on_baseline_workload", final_benchmark_while_the_server_dies)
    monkeypatch.setattr("agent.transcripts.report.write_report", lambda *a, **k: None)
    runner = SimpleNamespace(
        best_reps=[object()],  # a winner judged on another workload: measured again at the end
        best=SimpleNamespace(workload="shared-prefix"),
        kept_changes=[SimpleNamespace(describe=lambda: "--enable-mixed-chunk")],
        exhausted="",
        halted="",
        trials=[],
        restarts=2,
    )
    config = SimpleNamespace(target=SimpleNamespace(endpoint=server.endpoint, api_key=None))
    out = io.StringIO()
    ui = RunUI(Console(file=out, width=200))
    result = asyncio.run(
        session._final(
            ui, config, runner, SimpleNamespace(reps=[]), "done", "completed", time.monotonic(), 0.0
        )
    )
    assert died
    assert "deployed: --enable-mixed-chunk; healthy: False" in out.getvalue(), out.getvalue()
    assert result.failed and "server unhealthy at the end" in result.status
