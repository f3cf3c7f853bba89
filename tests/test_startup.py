"""Start-up: `optagent --help` fast through lazy imports, `--version`, and no vendor banner in the
product's output (pydantic-ai shows one on a terminal; pytest hides it, so the test uses a pty)."""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

import pexpect

ROOT = Path(__file__).parents[1]
HELP = "import sys; from agent.cli.main import app; sys.argv = ['optagent', '--help']; app()"


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    done = subprocess.run([sys.executable, "-c", HELP.replace("--help", "--version")], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == f"optagent {version('optagent')}"


def test_help_starts_within_8x_a_bare_python() -> None:
    def seconds(code: str) -> float:
        """CPU seconds of the child (user + system): what the start-up costs, without the waits
        for a core that a loaded machine (load 8 on 2 cores while other suites run) adds to both."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, cwd=ROOT, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    bare, help_ = [], []
    for _ in range(5):  # interleaved
        bare.append(seconds("pass"))
        help_.append(seconds(HELP))
    ratio = statistics.median(help_) / statistics.median(bare)
    assert ratio <= 8, (help_, bare)


def test_no_logfire_banner_on_a_terminal() -> None:
    script = (
        "import agent.cli.main\n"
        "from pydantic_ai import Agent\nfrom pydantic_ai.models.test import TestModel\n"
        "print(Agent(TestModel(), name='planner').run_sync('x').output)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_VERSION", "PYDANTIC_AI_NO_BANNER")}
    child = pexpect.spawn(
        sys.executable, ["-c", script], env=env, cwd=str(ROOT), encoding="utf-8", timeout=120
    )
    out = child.read()
    child.close()
    assert "success (no tool calls)" in out and "Logfire" not in out and "logfire" not in out, out


def test_help_lists_every_command_with_its_own_help_line_without_importing_it() -> None:
    code = (
        "import sys; from agent.cli.main import app; sys.argv = ['optagent', '--help']\n"
        "try: app()\nexcept SystemExit: pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('agent.cli.', 'pydantic', 'tools.'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.stdout.strip().endswith("['agent.cli.main']"), done.stdout[-500:]
    from agent.cli.main import COMMANDS, load_command

    for name, entry in COMMANDS.items():  # the listing's line is the command's own first line
        command = load_command(name)
        assert (command.help or "").strip().splitlines()[0] == entry.help, name
