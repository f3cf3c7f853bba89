"""`@pytest.mark.turns(name)` (tests/fixtures/quiet.py), run by a real pytest with two xdist workers:
tests of one name never overlap, and the rest of the suite runs beside them."""

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


def test_tests_of_one_name_take_turns_while_the_others_run_beside_them(tmp_path: Path) -> None:
    (tmp_path / "test_first.py").write_text(HEAD + FIRST)
    (tmp_path / "test_second.py").write_text(HEAD + SECOND)
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "TURNS_LOG": str(log), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p", "tests.fixtures.quiet", "-p", "no:cacheprovider",
         "-W", "ignore::pytest.PytestUnknownMarkWarning", "test_first.py", "test_second.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    spans = {name: (start, end) for name, start, end in map(json.loads, log.read_text().splitlines())}
    assert set(spans) == {"a", "b", "c", "d"}

    def overlap(x: str, y: str) -> bool:
        return spans[x][0] < spans[y][1] and spans[y][0] < spans[x][1]

    assert not overlap("a", "b")  # one at a time
    assert overlap("a", "d") and overlap("b", "c")  # the other worker went on beside each
