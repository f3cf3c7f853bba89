"""The goal's words are matched as words, and what optagent echoes from the user or the host holds
no terminal control sequence (issue 52, item 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agent.transcripts.transcript import Transcript
from tools.bench.objective import objective_from_goal, read_goal
from tools.deploy.serverlog import error_line, readable_tail

CLI = [sys.executable, "-c", "from agent.cli.main import app; app()"]
HOSTILE = "improve throughput\x1b]0;pwned\x07\x1b[2J\x1b[31m [bold]loud[/bold]\r\u202eevil"


def test_goal_words_match_at_word_boundaries() -> None:
    title = read_goal("improve throughput for our title generation service").objective  # "title" holds "itl"
    assert title.metrics == ["output_throughput"] and title.levels is None and title.words == "throughput"
    assert objective_from_goal("improve throughput for the format c8 service").levels is None  # "at c8"
    assert objective_from_goal("more throughput, said the itler").metrics == ["output_throughput"]
    assert objective_from_goal("a noninteractive batch job: throughput").kind == "throughput"
    # words standing alone still choose what they name, a number right after a word included
    assert objective_from_goal("reduce the p99 itl").metrics == ["p99_itl_ms"]
    assert objective_from_goal("improve throughput at c64").levels == [64]
    assert objective_from_goal("improve throughput @ c=64").levels == [64]
    slo = objective_from_goal("improve throughput keeping p99 TTFT<500ms at concurrency 8").slo
    assert slo is not None and (slo.metric, slo.max_ms, slo.level) == ("p99_ttft_ms", 500.0, 8)
    assert read_goal("make the chatbot more interactive").objective.kind == "latency"


def _cli(*args: str, width: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(width), "TERM": "xterm-256color"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env)


def test_transcripts_list_and_show_echo_no_control_sequences(tmp_path: Path) -> None:
    t = Transcript.create(tmp_path, kind="run", goal=HOSTILE, model="m\x1b[5m", target="http://h\x07")
    t.event("note", {"text": "host said \x1b[2J\x1b]0;owned\x07"})
    t.close({"status": "done"})
    for args, width in [(("list",), 80), (("list",), 200), (("show", "last"), 100),
                        (("review", "last", "--markdown"), 100), (("export", "last"), 100)]:  # fmt: skip
        done = _cli("transcripts", *args, "--dir", str(tmp_path), width=width)
        assert done.returncode == 0, done.stderr
        out = done.stdout
        assert not any(c in out for c in "\x1b\x07\r\u202e"), (args, width, out)
        assert "improve throughput" in out and "pwned" not in out and "[2J" not in out, (args, out)
        if args[0] in ("list", "show"):
            assert "[bold]loud[/bold]" in "".join(out.split()), (args, out)  # shown as written, not as markup


def test_host_log_lines_are_shown_without_control_sequences() -> None:
    log = "starting\n\x1b]0;pwned\x07\x1b[2JValueError: bad \x1b[31mvalue\x1b[0m\r\n"
    assert error_line(log) == "ValueError: bad value"
    assert "\x1b" not in readable_tail(log) and "\r" not in readable_tail(log)


def test_json_output_escapes_what_a_terminal_would_act_on(tmp_path: Path) -> None:
    """`--json` keeps the goal exactly (JSON escapes), but no raw C1 or bidi control reaches the
    terminal: `json.dumps(ensure_ascii=False)` writes U+009B (a one-byte CSI) and U+202E as they are."""
    import json

    goal = "improve throughput café \x9b2J\u202eevil\x85"
    t = Transcript.create(tmp_path, kind="run", goal=goal, model="m", target="t")
    t.close({"status": "done"})
    for args in (("list", "--json"), ("show", "last", "--json")):
        done = _cli("transcripts", *args, "--dir", str(tmp_path), width=100)
        assert done.returncode == 0, done.stderr
        assert not any(c in done.stdout for c in "\x9b\u202e\x85"), (args, done.stdout)
        assert "café" in done.stdout  # other non-ASCII text stays readable
        data = json.loads(done.stdout)
        text = json.dumps(data, ensure_ascii=False)
        assert goal in text, (args, text[:300])
