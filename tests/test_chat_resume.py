"""`optagent chat --resume` carries the restart counter over (issue 28 item 4): every restart a
saved session spent counts against the budget, including those no trial record holds (a run's
launch-spread relaunches), and those of a session that ended without writing its count."""

from __future__ import annotations

import time
from pathlib import Path

from agent.chat.setup import restore_state
from agent.transcripts.load import load_transcript
from agent.transcripts.transcript import Transcript
from agent.trial.record import Baseline, TrialChange, TrialRecord
from agent.trial.runner import TrialRunner
from tools.config import BenchConfig

UNIT = "[Service]\nExecStart=/usr/bin/python -m sglang.launch_server --model-path /m --tp-size 4\n"


class _Deps:
    """What `restore_state` fills: the todo list, the verdicts and the trial runner."""

    def __init__(self) -> None:
        from agent.policy.todo import TodoList

        self.todo, self.verdicts = TodoList(), {}
        self.runner = TrialRunner(deployment=None, endpoint="http://127.0.0.1:9", bench=BenchConfig(),
                                  objective=None, baseline=Baseline(reps=[], probe=None, text=UNIT))  # fmt: skip


def _trial(number: int, restarts: int, decision: str = "rolled_back") -> dict:
    change = TrialChange(flag="--enable-mixed-chunk")
    return TrialRecord(number=number, changes=[change], decision=decision, restarts=restarts).model_dump(
        mode="json"
    )


def _restored(path: Path) -> tuple[int, list[str], int]:
    deps = _Deps()
    notes = restore_state(deps, load_transcript(path))
    return deps.runner.restarts, notes, len(deps.runner.trials)


def _run_that_spent_six(tmp_path: Path) -> Path:
    """A saved run: two launch-spread relaunches (no trial holds them) and one trial of four restarts."""
    t = Transcript.create(tmp_path, kind="run", goal="improve throughput", model="builtin", target="sim")
    t.event("launch_spread", {"source": "measured", "launches": 3})
    t.event("trial", _trial(1, 4, "kept"))
    t.close({"status": "completed", "kept": ["--enable-mixed-chunk"], "restarts": 6})
    time.sleep(0.01)  # a resumed session starts later: its records are stamped after the end
    return t.path


def test_resuming_a_run_counts_the_restarts_its_trials_do_not_hold(tmp_path: Path) -> None:
    restarts, notes, trials = _restored(_run_that_spent_six(tmp_path))
    assert (restarts, trials) == (6, 1)  # it said 4: the spread relaunches were lost
    assert "6 restarts spent earlier count against the budget" in notes


def test_a_chat_that_ended_without_its_count_adds_its_trials_and_undos(tmp_path: Path) -> None:
    """A resumed chat that failed (its end record has no count): the run's count at its end, plus
    what was recorded after it."""
    path = _run_that_spent_six(tmp_path)
    chat = Transcript.resume(path)
    chat.event("trial", _trial(2, 2))
    chat.event("deploy", {"action": "undo", "trial": 1, "ok": True})
    chat.close({"status": "failed: RuntimeError: boom"})
    assert _restored(path)[0] == 6 + 2 + 1


def test_a_chat_that_wrote_its_count_is_resumed_with_it(tmp_path: Path) -> None:
    path = _run_that_spent_six(tmp_path)
    chat = Transcript.resume(path)
    chat.event("trial", _trial(2, 2))
    chat.close({"status": "exit", "kept": [], "restarts": 8})
    time.sleep(0.01)
    again = Transcript.resume(path)  # a third session that crashed after one trial: no end record
    again.event("trial", _trial(3, 3))
    restarts, _, trials = _restored(path)
    assert (restarts, trials) == (8 + 3, 3)
