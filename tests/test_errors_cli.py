"""Errors in one actionable line: an HTML export is not written to a terminal, a config key typo
gets a "did you mean", a run against a stopped simulated server says how to check it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pexpect
import pytest

from tests.transcript_sessions import write_session
from tools.config import ConfigError, load_config

pytestmark = pytest.mark.server

ROOT = Path(__file__).parents[1]


def _optagent_in_pty(*args: str, cwd: Path) -> tuple[int, str]:
    code = "from agent.cli.main import app; import sys; sys.argv = ['optagent', *sys.argv[1:]]; app()"
    child = pexpect.spawn(sys.executable, ["-c", code, *args], cwd=str(cwd), encoding="utf-8", timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"})  # fmt: skip
    out = child.read()
    child.close()
    return child.exitstatus, out


def test_html_export_refuses_a_terminal_and_writes_a_file_or_a_pipe(tmp_path: Path) -> None:
    path = write_session(tmp_path)
    code, out = _optagent_in_pty("transcripts", "export", str(path), "--format", "html", cwd=tmp_path)
    assert code == 2 and "give -o FILE.html" in out and "base64," not in out, out[:500]
    code, out = _optagent_in_pty("transcripts", "export", str(path), "--format", "html", "-o", "s.html",
                                 cwd=tmp_path)  # fmt: skip
    assert code == 0 and "data:image/png;base64," in (tmp_path / "s.html").read_text()
    import subprocess

    piped = subprocess.run([sys.executable, "-c", "from agent.cli.main import app; app()", "transcripts",
                            "export", str(path), "--format", "html"], capture_output=True, text=True,
                           cwd=ROOT, timeout=120)  # fmt: skip
    assert piped.returncode == 0 and piped.stdout.startswith("<!DOCTYPE html>")


def test_a_config_key_typo_gets_a_did_you_mean(tmp_path: Path) -> None:
    bad = tmp_path / "optagent.toml"
    bad.write_text(
        '[target]\nendpiont = "http://127.0.0.1:1"\n[agnet]\nmodel = "builtin"\n[bench]\nzzz = 1\n'
    )
    try:
        load_config(bad)
    except ConfigError as e:
        text = str(e)
    else:
        raise AssertionError("a bad key was accepted")
    assert "target.endpiont: unknown key; did you mean 'endpoint'?" in text
    assert "agnet: unknown key; did you mean 'agent'?" in text
    assert "bench.zzz: unknown key\n" in text + "\n" and "zzz: unknown key; did" not in text


def test_errors_read_as_one_line_without_traceback_text() -> None:
    from agent.cli.common import one_line

    research_failed = (
        "research of --enable-mixed-chunk failed:\nTraceback (most recent call last):\n"
        '  File "x.py", line 3, in f\n    raise ConnectError("All connection attempts failed")\n'
        "httpx.ConnectError: All connection attempts failed\n"
    )
    text = one_line(research_failed, simulated=True)
    assert "\n" not in text and "Traceback" not in text and 'File "' not in text
    assert text == (
        "research of --enable-mixed-chunk failed httpx.ConnectError: All connection attempts failed; "
        "is the server running? `optagent sim status`"
    )
    assert one_line("the server at http://x is not healthy: not healthy after 120s", simulated=False) == (
        "the server at http://x is not healthy: not healthy after 120s"
    )
