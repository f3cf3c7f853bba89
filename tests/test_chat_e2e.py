"""`optagent chat` and `optagent run` end to end against the simulated deployment (real processes,
real HTTP, the builtin model), then every `transcripts` subcommand on what they saved."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.sim import free_port

pytestmark = pytest.mark.slow(seconds=200)  # the whole file: one deployment its tests share


CLI = "import sys; from agent.cli.main import app; app(sys.argv[1:])"


def _toml(name: str, data: dict) -> str:
    return "\n".join([f"[{name}]"] + [f"{k} = {json.dumps(v)}" for k, v in data.items() if v is not None])


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory):
    """A simulated seed host whose baseline runs without CUDA graphs (so removing
    `--disable-cuda-graph` is a large, measurable gain), and an optagent.toml for it."""
    from sim import host
    from tools.deploy.units.file import UnitFile

    d = tmp_path_factory.mktemp("chat-e2e")
    cfg = host.create(d / "sim", scenario="seed", port=free_port(), time_scale=0.03)
    for unit in (d / "sim" / "sglang.service", d / "sim" / "local" / "sglang.service"):
        unit.write_text(UnitFile.load(unit).set_flag("--disable-cuda-graph").render())
    host.ensure_up(d / "sim")
    bench = {
        "concurrency": [1, 2],
        "input_len": 256,
        "output_len": 64,
        "prompts_per_level": 12,
        "warmup": 1,
        "reps": 3,
        # the declared launch spread: these runs are about the chat and the CLI, and at time scale
        # 0.03 a relaunch beside other tests measures the two cores (a spread of 10%+ stops a run)
        "spread_launches": 0,
    }
    agent = {"transcripts_dir": str(d / "transcripts"), "max_trials": 4}
    target = cfg.target.model_dump(mode="json")
    text = "simulated = true\n" + "\n\n".join(
        [_toml("target", target), _toml("bench", bench), _toml("agent", agent)]
    )
    (d / "optagent.toml").write_text(text + "\n")
    yield d
    host.down(d / "sim")


def _optagent(d: Path, *args: str, stdin: str = "", timeout: float = 900) -> subprocess.CompletedProcess:
    """`optagent *args` in the deployment's folder. The bound only catches a hang: a cold research cache
    and four test workers on two cores made a one-trial run take over 300 s in CI (23 s alone)."""
    return subprocess.run(
        [sys.executable, "-c", CLI, *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=d,
        timeout=timeout,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )


def _transcripts(d: Path) -> list[dict]:
    out = _optagent(d, "transcripts", "list", "--dir", str(d / "transcripts"), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_chat_research_keep_rollback_then_resume(deployment: Path) -> None:
    from agent.transcripts.load import load_transcript

    d = deployment
    script = (
        "research --disable-cuda-graph\nunset --disable-cuda-graph\ny\n/status\nroll back\ny\n/bench\n/exit\n"
    )
    out = _optagent(d, "chat", "--config", "optagent.toml", stdin=script)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log = out.stdout
    assert "you> research --disable-cuda-graph" in log
    # no baseline before the prompt: it is measured once a trial is approved, right before it
    assert log.index("you>") < log.index("approved") < log.index("measuring the baseline first")
    assert log.index("measuring the baseline first") < log.index("trial 1 · block 1/3")
    assert "-    --disable-cuda-graph" in log.replace(" \\", "")  # the diff shown before approval
    assert "trial 1" in log and ": kept" in log, log[-3000:]
    # the trial's headline is printed once when it ends; the chat's reply adds why and the paired
    # blocks' numbers, not a geometric mean or a baseline measured earlier (it said "kept (+0.7%)")
    turn = log[log.index("you> unset --disable-cuda-graph") : log.index("you> /status")]
    assert turn.count("trial 1 [unset --disable-cuda-graph]: kept") == 1, turn[-3000:]
    assert "optagent> trial 1: " in turn and "optagent> trial 1 [" not in turn
    assert "geometric mean" not in turn and "(95% CI)" not in turn  # the figures the rule did not use
    assert "per level, known-good -> candidate (the blocks the decision compared): c=1: " in log
    assert "baseline:  c1" not in log
    assert "deployed: trial 1" in log and "health: ok" in log
    # the run's restart budget applies to a chat too (the sim's playbook grid: at least 8)
    assert re.search(r"restarts: [1-3] of (\d+), budget: available", log), log[-3000:]
    assert int(re.search(r"restarts: \d+ of (\d+)", log).group(1)) >= 8
    assert "rolled back trial 1 (unset --disable-cuda-graph); deployed now: the configuration at start" in log
    assert "benchmark of the deployed configuration: c1:" in log
    assert "--disable-cuda-graph" in (d / "sim" / "sglang.service").read_text()  # back on the baseline

    [session] = _transcripts(d)
    assert session["kind"] == "chat" and session["status"] == "exit" and session["kept"] == []
    loaded = load_transcript(Path(session["path"]))
    assert [a["data"]["approved"] for a in loaded.events_of("approval")] == [True, True]
    assert loaded.events_of("approval")[0]["data"]["diff"].count("--disable-cuda-graph") == 1
    [trial] = loaded.events_of("trial")
    assert trial["data"]["decision"] == "kept" and trial["data"]["changes"][0]["action"] == "unset"
    undo = [e for e in loaded.events_of("deploy") if e["data"].get("action") == "undo"]
    assert undo and undo[0]["data"]["ok"] and undo[0]["data"]["now"] == "baseline"

    out = _optagent(
        d, "chat", "--config", "optagent.toml", "--resume", session["id"][:-1], stdin="status\n/exit\n"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "1 research verdicts restored" in out.stdout
    assert "1 earlier trials; kept: trial 1 [unset --disable-cuda-graph]: kept" in out.stdout  # not markup
    # the unit is back on the one the saved baseline ran on: that baseline is reused
    assert "baseline: the saved one, measured" in out.stdout and "measuring the baseline" not in out.stdout
    # status in words (no JSON); the restarts of the first session still count (they restarted at 0)
    assert "deployed: the configuration at start" in out.stdout and '"deployed_best"' not in out.stdout
    carried = int(re.search(r"(\d+) restarts spent earlier count against the budget", out.stdout).group(1))
    assert carried == loaded.end["outcome"]["restarts"] >= 2, out.stdout[-2000:]  # the count it ended with
    assert re.search(rf"restarts: {carried} of \d+, budget:", out.stdout), out.stdout[-2000:]
    loaded = load_transcript(Path(session["path"]))
    assert loaded.error is None and any(e["data"].get("resumed") for e in loaded.events_of("note"))
    history = loaded.model_messages()
    assert history[0].parts[-1].content == "research --disable-cuda-graph"
    assert max(m["msg"] for m in loaded.messages) == len(loaded.messages)  # numbering continued


def _on_a_terminal(d: Path, *args: str) -> Any:
    """`optagent ARGS` on a pseudo-terminal (Ctrl-C is a SIGINT from the terminal, as for a user)."""
    import pexpect

    env = {**__import__("os").environ, "COLUMNS": "200"}
    return pexpect.spawn(
        sys.executable, ["-c", CLI, *args], cwd=str(d), env=env, encoding="utf-8", timeout=600,
        dimensions=(50, 200), preexec_fn=_default_ctrl_c,
    )  # fmt: skip


def _default_ctrl_c() -> None:
    """A user's terminal delivers Ctrl-C to a process that has not chosen to ignore it; a test run
    started in the background (a shell's `&`, some CI runners) ignores SIGINT and would pass that on."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _other_flags(unit: Path, known_good: str) -> bool:
    """The unit on the host launches the server with other flags than `known_good` (a candidate is
    deployed; a rewrite of the same launch line is not one)."""
    from tools.deploy.units.file import UnitFile, UnitFileError

    try:
        return UnitFile.parse(unit.read_text()).command.flags != UnitFile.parse(known_good).command.flags
    except (UnitFileError, OSError):
        return False  # mid-write


def _healthy(d: Path) -> bool:
    import httpx

    endpoint = (d / "sim" / "endpoint").read_text().strip()
    return httpx.get(endpoint + "/health", timeout=10).status_code == 200


def test_ctrl_c_during_an_approved_trial_puts_the_target_back_on_known_good(deployment: Path) -> None:
    """On a terminal, Ctrl-C while a trial runs cancels it and the target is back on its known-good
    unit, healthy. (The approval prompt before the trial used to take SIGINT over and leave the
    step without a handler: Ctrl-C then did nothing and the trial ran on.)"""
    import pexpect

    from agent.transcripts.load import load_transcript

    d, unit = deployment, deployment / "sim" / "sglang.service"
    assert "--disable-cuda-graph" in unit.read_text()  # the known-good (baseline) unit
    before = {s["id"] for s in _transcripts(d)}
    child = _on_a_terminal(d, "chat", "--config", "optagent.toml")
    try:
        child.expect("you>")
        child.sendline("unset --disable-cuda-graph")
        child.expect("apply this change")
        child.sendline("y")
        deadline = time.monotonic() + 120
        while "--disable-cuda-graph" in unit.read_text():  # the candidate is being deployed
            assert time.monotonic() < deadline, "the candidate was never deployed"
            child.expect([pexpect.TIMEOUT, "you>"], timeout=0.05)
        child.sendintr()
        child.expect("interrupted")
        child.expect("known-good configuration")
        child.expect("you>")
        child.expect(pexpect.TIMEOUT, timeout=3)  # no live line of the cancelled step redraws
        bars = r"tok/s|block \d|waiting for the server|researching|benchmark|restart"
        assert not re.search(bars, child.before), child.before
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert "--disable-cuda-graph" in unit.read_text()
    assert _healthy(d)
    [chat] = [s for s in _transcripts(d) if s["id"] not in before]
    loaded = load_transcript(Path(chat["path"]))
    assert not loaded.events_of("trial") or loaded.events_of("trial")[0]["data"]["decision"] != "kept"
    stops = [e["data"] for e in loaded.events_of("deploy") if e["data"].get("action") == "interrupted"]
    assert stops and stops[0]["rollback_ok"] is True


def test_ctrl_c_during_a_run_trial_rolls_back_before_the_command_returns(deployment: Path) -> None:
    """`optagent run` on a terminal: Ctrl-C while a candidate is deployed cancels the trial, which
    rolls itself back before the command exits; the transcript ends as interrupted."""
    import pexpect

    d, unit = deployment, deployment / "sim" / "sglang.service"
    known_good = unit.read_text()
    before = {s["id"] for s in _transcripts(d)}
    # a benchmark long enough that the Ctrl-C below lands inside the trial even when this process
    # is slow to notice the deploy (a loaded machine): a futile candidate otherwise ends in ~6 s
    slow = (
        (d / "optagent.toml")
        .read_text()
        .replace("reps = 3", "reps = 6")
        .replace("prompts_per_level = 12", "prompts_per_level = 48")
    )
    assert slow != (d / "optagent.toml").read_text()
    (d / "optagent-slow.toml").write_text(slow)
    child = _on_a_terminal(d, "run", "--config", "optagent-slow.toml", "--yes", "--max-trials", "1")
    child.logfile_read = said = io.StringIO()
    try:
        deadline = time.monotonic() + 600
        while not _other_flags(unit, known_good):  # wait for the candidate's deploy
            assert time.monotonic() < deadline and child.isalive(), "no candidate was deployed"
            child.expect([pexpect.TIMEOUT, pexpect.EOF], timeout=0.05)
        child.sendintr()
        child.expect(pexpect.EOF, timeout=600)
    finally:
        child.close(force=True)
    assert unit.read_text() == known_good
    assert _healthy(d)
    [run] = [s for s in _transcripts(d) if s["id"] not in before]
    assert run["status"] == "interrupted", run
    assert "interrupted: nothing in flight, the server runs the last known-good" in " ".join(
        said.getvalue().split()
    )


def test_transcripts_commands_on_a_real_run(deployment: Path, tmp_path: Path) -> None:
    d = deployment
    before = {s["id"] for s in _transcripts(d)}
    out = _optagent(d, "run", "--config", "optagent.toml", "--yes", "--max-trials", "1")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    [run] = [s for s in _transcripts(d) if s["id"] not in before]
    assert run["kind"] == "run" and run["messages"] > 5
    tdir = str(d / "transcripts")

    shown = _optagent(d, "transcripts", "show", run["id"], "--dir", tdir)
    assert shown.returncode == 0 and "[msg 1] planner · user" in shown.stdout
    assert "    [msg" in shown.stdout and "researcher:--" in shown.stdout  # subagents indented
    assert "● todo list" in shown.stdout and "● trial" in shown.stdout

    review = _optagent(d, "transcripts", "review", run["id"], "--dir", tdir, "--markdown")
    assert review.returncode == 0
    for needle in (
        "- SGLang version: 0.5.23",
        "RTX PRO 6000",
        "## Research verdicts",
        "### Trial 1:",
        "## Final gain",
    ):
        assert needle in review.stdout, needle
    assert "| 1 | " in review.stdout.split("## Baseline")[1]

    page = tmp_path / "run.html"
    exported = _optagent(
        d, "transcripts", "export", run["id"], "--dir", tdir, "--format", "html", "-o", str(page)
    )
    assert exported.returncode == 0 and "data:image/png;base64," in page.read_text()

    # a run cut short by a crash: the reader keeps everything before the bad line
    text = Path(run["path"]).read_text()
    cut = d / "transcripts" / "cut-session.jsonl"
    cut.write_text(text[: len(text) * 2 // 3])
    review = _optagent(d, "transcripts", "review", str(cut), "--dir", tdir, "--markdown")
    assert (
        review.returncode == 0
        and "status: damaged at line" in review.stdout
        and "truncated line" in review.stderr
    )
    assert "## Context found" in review.stdout and "- SGLang version: 0.5.23" in review.stdout
    cut.unlink()
