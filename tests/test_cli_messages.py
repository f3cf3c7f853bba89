"""What the command line says when things go sideways (issue 51, item 9): a locked target names who
holds it and what to do, in `run` and `chat` alike, and leaves no empty transcript to become `last`
(a resumed chat's saved file stays); a mistyped command gets
the close ones; asyncssh's deprecation note is not printed; an error after Ctrl-C starts on its own
line, not at the end of a progress bar still drawn."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from rich.console import Console

from agent.ui import RunUI
from tests.test_deploy import OPTAGENT


def _config(cfg, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    lines = ["[target]"]
    lines += [f"{k} = {json.dumps(v if isinstance(v, bool | int | float) else str(v))}"
              for k, v in cfg.target.model_dump(mode="json").items() if v is not None]  # fmt: skip
    lines += ["[agent]", f"transcripts_dir = {json.dumps(str(tmp_path / 'tx'))}"]
    path = tmp_path / "optagent.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_locked_target_says_who_holds_it_and_keeps_no_transcript(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from agent.transcripts.load import find_transcript
    from agent.transcripts.transcript import Transcript
    from sim import host
    from tools.deploy.deployment import Deployment

    cfg = sim_host("seed")
    host.ensure_up(Path(cfg.target.remote_unit).parent)
    config = _config(cfg, tmp_path)
    earlier = Transcript.create(tmp_path / "tx", kind="run", goal="g", model="builtin", target="sim")
    earlier.event("note", {"text": "an earlier run"})
    earlier.close({"status": "completed"})
    time.sleep(0.05)  # `last` goes by modification time

    async def while_locked() -> subprocess.CompletedProcess[str]:
        async with Deployment(cfg.target, command="optagent run"):  # this process holds the lock
            return await asyncio.to_thread(
                subprocess.run,
                [OPTAGENT, "run", "--goal", "improve throughput", "--yes", "--config", str(config)],
                capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, "COLUMNS": "200"},
            )  # fmt: skip

    second = asyncio.run(while_locked())
    said = " ".join(second.stderr.split())
    assert second.returncode == 1, second.stdout + second.stderr
    assert f"the target is locked by another optagent (pid {os.getpid()} on " in said, said
    assert "(optagent run)): wait for it to finish, or stop it" in said and "then run this again" in said
    assert "LockedError" not in second.stdout + second.stderr and "Traceback" not in second.stderr
    assert sorted(p.name for p in (tmp_path / "tx").iterdir()) == [earlier.path.name]
    assert find_transcript("last", tmp_path / "tx") == earlier.path


def _while_locked(cfg, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    """`optagent *args` run while this process holds the target's lock, as an `optagent run` would."""
    from tools.deploy.deployment import Deployment

    async def locked() -> subprocess.CompletedProcess[str]:
        async with Deployment(cfg.target, command="optagent run"):
            return await asyncio.to_thread(
                subprocess.run, [OPTAGENT, *args], input="/exit\n", capture_output=True, text=True,
                timeout=120, cwd=cwd, env={**os.environ, "COLUMNS": "200"},
            )  # fmt: skip

    return asyncio.run(locked())


def test_a_chat_on_a_locked_target_says_so_as_run_does_and_keeps_no_transcript(
    sim_host, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The same plain message as `optagent run`, and no 0-message chat left to become `last`."""
    from agent.transcripts.load import find_transcript
    from agent.transcripts.transcript import Transcript
    from sim import host

    cfg = sim_host("seed")
    host.ensure_up(Path(cfg.target.remote_unit).parent)
    config = _config(cfg, tmp_path)
    earlier = Transcript.create(tmp_path / "tx", kind="run", goal="g", model="builtin", target="sim")
    earlier.close({"status": "completed"})
    time.sleep(0.05)  # `last` goes by modification time

    second = _while_locked(cfg, "chat", "--config", str(config), cwd=tmp_path)
    said = " ".join(second.stderr.split())
    assert second.returncode == 1, second.stdout + second.stderr
    assert f"the target is locked by another optagent (pid {os.getpid()} on " in said, said
    assert "then run this again (nothing was changed, and no transcript kept)" in said, said
    assert "LockedError" not in second.stdout + second.stderr and "Traceback" not in second.stderr
    assert "resume with" not in second.stdout  # there is nothing to resume
    assert sorted(p.name for p in (tmp_path / "tx").iterdir()) == [earlier.path.name]
    assert find_transcript("last", tmp_path / "tx") == earlier.path


def test_a_resumed_chat_on_a_locked_target_keeps_the_saved_chat_resumable(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A saved chat is the user's: the lock refuses the session, it never deletes the file, nor
    closes it again with counters missing (a later --resume reads the last `end`)."""
    from agent.transcripts.load import load_transcript
    from agent.transcripts.transcript import Transcript
    from sim import host

    cfg = sim_host("seed")
    host.ensure_up(Path(cfg.target.remote_unit).parent)
    config = _config(cfg, tmp_path)
    saved = Transcript.create(
        tmp_path / "tx", kind="chat", goal="improve throughput", model="builtin", target="sim"
    )
    saved.event("note", {"text": "an earlier chat"})
    saved.close({"status": "exit", "kept": [], "restarts": 3})

    second = _while_locked(cfg, "chat", "--config", str(config), "--resume", saved.id, cwd=tmp_path)
    said = " ".join(second.stderr.split())
    assert second.returncode == 1, second.stdout + second.stderr
    assert f"the target is locked by another optagent (pid {os.getpid()} on " in said, said
    assert "nothing was changed; the saved session stays resumable" in said, said
    assert "LockedError" not in second.stdout + second.stderr
    assert sorted(p.name for p in (tmp_path / "tx").iterdir()) == [saved.path.name]
    assert load_transcript(saved.path).end["outcome"] == {"status": "exit", "kept": [], "restarts": 3}


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [
        ("rn", "Did you mean `run`?"),
        ("staus", "Did you mean `status`?"),
        ("transcript", "Did you mean `transcripts`?"),
    ],
)
def test_a_mistyped_command_gets_the_close_ones(typed: str, suggested: str) -> None:
    done = subprocess.run([OPTAGENT, typed], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert done.returncode == 2 and f"No such command '{typed}'. {suggested}" in done.stderr, done.stderr


def test_a_command_far_from_every_name_gets_no_guess() -> None:
    done = subprocess.run([OPTAGENT, "xyzzy"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert (
        done.returncode == 2
        and "No such command 'xyzzy'" in done.stderr
        and "Did you mean" not in done.stderr
    )


def test_the_ssh_transport_imports_without_cryptographys_deprecation_note() -> None:
    """The note is silenced for asyncssh alone: the same category from anywhere else still shows."""
    code = (
        "import warnings, tools.deploy.ssh\n"
        "from cryptography.utils import CryptographyDeprecationWarning\n"
        "warnings.warn('from elsewhere', CryptographyDeprecationWarning)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[1])  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "asyncssh" not in done.stderr and "DSA is deprecated" not in done.stderr, done.stderr
    assert "CryptographyDeprecationWarning: from elsewhere" in done.stderr


def _screen(raw: str) -> list[str]:
    """The lines a terminal shows for `raw`: carriage return, newline, erase line and cursor up
    applied, colours dropped."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+", raw):
        if token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        elif token == "\x1b[2K":
            lines[row] = ""
        elif re.fullmatch(r"\x1b\[(\d*)A", token):
            row = max(0, row - int(token[2:-1] or 1))
        elif not token.startswith("\x1b"):
            lines[row] = lines[row][:col].ljust(col) + token + lines[row][col + len(token) :]
            col += len(token)
    return [line.rstrip() for line in lines]


def test_an_error_after_ctrl_c_starts_on_its_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollback's wait bar still drawn when the interrupted run fails: the message must not be
    glued to its end (stdout and stderr share the terminal, as here one buffer)."""
    from agent.cli import common

    terminal = io.StringIO()
    out = Console(file=terminal, force_terminal=True, width=100)
    err = Console(file=terminal, force_terminal=True, width=100)
    monkeypatch.setattr(common, "console", out)
    monkeypatch.setattr(common, "err_console", err)
    ui = RunUI(out)
    ui.deploy_progress("wait:health", 1.0, 60.0)  # the rollback's wait bar, as a run draws it
    ui._wait_bar.refresh()  # started, not stopped, when the KeyboardInterrupt arrives
    with pytest.raises(typer.Exit):
        common.fail("interrupted: nothing in flight, the server runs the last known-good configuration")
    shown = [line for line in _screen(terminal.getvalue()) if line]
    assert shown[-1].startswith("error: interrupted: nothing in flight"), shown
    assert not any("waiting for the server" in line for line in shown), shown  # the bar is gone
