"""A question holds every live display, with each rich release optagent accepts: the installed one
and the oldest `pyproject.toml` allows (its `rich>=` floor, downloaded once per run from the package
index pip is configured for). `held` once read rich's private list of running displays, which rich
13 does not have: there the restart-wait bar redrew over `Deploy this change? [y/N]:`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A run's restart-wait bar on a terminal, then `confirm` (deploy's question) answered by a person
# who takes 0.8 s: what the terminal received meanwhile, and whether the bar came back after.
ASK = r"""
import io, json, sys, time
if sys.argv[1:]:
    sys.path.insert(0, sys.argv[1])  # an older rich, ahead of the installed one
import rich
from rich.console import Console
from agent.cli.common import confirm
from agent.ui import RunUI

screen = io.StringIO()
console = Console(file=screen, force_terminal=True, width=100)
ui = RunUI(console)
ui.deploy_progress("wait:health", 1.0, 60.0)
time.sleep(0.4)
seen = {}

class Person:
    def readline(self):
        seen["asked"] = len(screen.getvalue())
        time.sleep(0.8)
        seen["answered"] = len(screen.getvalue())
        return "y\n"

sys.stdin = Person()
said = confirm("Deploy this change?", on=console)
time.sleep(0.4)
again = screen.getvalue()[seen["answered"]:]
ui.stop_wait()
print(json.dumps({"rich": rich.__file__, "said": said, "again": again,
                  "while_asked": screen.getvalue()[seen["asked"]:seen["answered"]]}))
"""


def _floor() -> str:
    """The oldest rich `pyproject.toml` accepts."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if re.match(r"rich\b", d)]
    found = re.search(r">=\s*([\w.]+)", spec)
    assert found, f"rich has no lower bound in pyproject.toml: {spec!r}"
    return found.group(1)


@pytest.fixture(scope="module")
def oldest_rich(tmp_path_factory: pytest.TempPathFactory) -> Path:
    version = _floor()
    where = tmp_path_factory.mktemp("rich")
    got = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", f"rich=={version}",
         "-d", str(where), "-q"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    wheels = list(where.glob("rich-*.whl"))
    if got.returncode != 0 or not wheels:
        pytest.fail(f"the package index is unreachable, no rich {version} wheel: {got.stderr[-500:]}")
    return wheels[0]  # pure Python: importable from the wheel itself


@pytest.mark.parametrize("release", ["installed", "oldest allowed"])
def test_a_question_is_not_drawn_over_whatever_the_rich_release(release: str, request) -> None:  # type: ignore[no-untyped-def]
    extra = [str(request.getfixturevalue("oldest_rich"))] if release == "oldest allowed" else []
    done = subprocess.run(
        [sys.executable, "-c", ASK, *extra], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.splitlines()[-1]  # the question's words, then the script's findings
    out = json.loads(last[last.index('{"rich"') :])
    assert (".whl" in out["rich"]) == bool(extra), out["rich"]  # the release meant is the one used
    assert out["said"] is True
    assert out["while_asked"] == "", out["while_asked"][:300]  # no bar drawn while the question waits
    assert "waiting for the server (health)" in out["again"]  # and the bar is back once answered
