"""`@pytest.mark.turns(name)` (tests/fixtures/quiet.py), run by a real pytest with xdist workers:
tests of one name never overlap, and the rest of the suite runs beside them; a quiet test waits for
its turn among them without stopping the other workers meanwhile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HEAD = """
import json, os, time
import pytest

def _stay(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    with open(os.environ["TURNS_LOG"], "a") as f:
        f.write(json.dumps([name, start, time.monotonic()]) + "\\n")
"""
# with --dist loadfile one worker takes each file: b would start at 0.5 s, while a still runs
FIRST = """
@pytest.mark.turns("whole-run")
def test_a():
    _stay("a", 1.5)

def test_c():
    _stay("c", 1.5)
"""
SECOND = """
def test_d():
    _stay("d", 0.5)

@pytest.mark.turns("whole-run")
def test_b():
    _stay("b", 1.5)
"""


QUIET = """
def test_q0():
    _stay("q0", 0.3)

@pytest.mark.quiet
def test_q():
    _stay("q", 0.5)
"""
BESIDE = """
def test_f():
    _stay("f", 0.6)

def test_g():
    _stay("g", 0.3)
"""


def _spans(tmp_path: Path, files: dict[str, str], workers: int) -> dict[str, tuple[float, float]]:
    """Each test's (start, end), from a real pytest run of `files` on `workers` xdist workers."""
    for name, text in files.items():
        (tmp_path / name).write_text(HEAD + text)
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "TURNS_LOG": str(log), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", str(workers), "--dist", "loadfile", "-p", "tests.fixtures.quiet",
         "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning", *files],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return {name: (start, end) for name, start, end in map(json.loads, log.read_text().splitlines())}


def _overlap(spans: dict[str, tuple[float, float]], x: str, y: str) -> bool:
    return spans[x][0] < spans[y][1] and spans[y][0] < spans[x][1]


def test_tests_of_one_name_take_turns_while_the_others_run_beside_them(tmp_path: Path) -> None:
    spans = _spans(tmp_path, {"test_first.py": FIRST, "test_second.py": SECOND}, 2)
    assert set(spans) == {"a", "b", "c", "d"}

    def overlap(x: str, y: str) -> bool:
        return _overlap(spans, x, y)

    assert not overlap("a", "b")  # one at a time
    assert overlap("a", "d") and overlap("b", "c")  # the other worker went on beside each


def test_a_quiet_test_waits_for_its_turn_without_stopping_the_others(tmp_path: Path) -> None:
    # a (a turn, 1.5 s) runs from the start; q (quiet) is ready at 0.3 s; g is ready at 0.6 s
    spans = _spans(tmp_path, {"test_first.py": FIRST, "test_quiet.py": QUIET, "test_beside.py": BESIDE}, 3)
    assert not _overlap(spans, "q", "a") and spans["q"][0] >= spans["a"][1]  # after the turn
    assert not any(_overlap(spans, "q", other) for other in spans if other != "q")  # alone
    # g started while q waited for a: waiting for its turn, q did not hold the gate
    assert spans["g"][0] < spans["a"][1]
