"""What a unit file asks the host to run, and whether the running process is exactly that (below `service.py`).

A unit file edited on the host but never restarted parses fine while the old process still serves:
only the process itself says what really runs. Its whole command line (`/proc/PID/cmdline`: program,
wrappers that stay, every argument) is compared with the unit's, after systemd's variable
expansion, and its environment (`/proc/PID/environ`) must hold every variable the unit sets. Two
things cannot be read from a process, and need a proof that it was started from the file as it is:

- a launch script (the process shows what the script ran, not the script), and
- the options of a wrapper that replaced itself (`taskset --cpu-list 0-1`, `nice -n 5`, ...).

The proof is either optagent's own record of the restart it made (the file's hash and the process it
started, `StartRecord`), or the file's last change (ctime, on the host's clock) coming before the
process started. Without one the answer is "unknown", and known-good is never recorded on "unknown".
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import datetime

from tools.deploy.journal import StartRecord, sha
from tools.deploy.transport import Transport
from tools.deploy.units.entry import exec_wrapper_end
from tools.deploy.units.envfile import environment_files, parse_env_file
from tools.deploy.units.file import UnitFile, UnitFileError

__all__ = [
    "RunCheck",
    "ServiceError",
    "StartRecord",
    "process_identity",
    "running_check",
    "running_matches",
    "unit_command",
    "unit_environment",
    "env_file_values",
]

MARGIN_S = 0.25
"""A process started at least this long after the file's last change was started from that content
(the two times come from the host's clocks, a few ms apart in resolution)."""


class ServiceError(Exception):
    """The service manager could not do what was asked; the message says what failed."""


@dataclass(frozen=True)
class RunCheck:
    """Whether the service runs exactly its file (None: cannot be told), and why not."""

    matches: bool | None
    why: str = ""


async def unit_command(
    transport: Transport, text: str, *, unit_path: str
) -> tuple[list[str], dict[str, str], str]:
    """(argv, environment, working directory) that the unit text `text` (installed at `unit_path`) asks for.

    `EnvironmentFile=` files are read on the host and override `Environment=`, as systemd does.
    """
    unit = UnitFile.parse(text, kind="script" if unit_path.endswith(".sh") else None)
    if unit.kind == "script":
        return ["sh", unit_path], {}, "."
    env = await unit_environment(transport, unit)
    argv = unit.exec_argv(env)
    if "=" in argv[0]:
        raise ServiceError(f"executable {argv[0]!r} contains '='; refusing to run it")
    return argv, env, unit.working_directory or "."


async def unit_environment(transport: Transport, unit: UnitFile) -> dict[str, str]:
    """The variables the service gets from its unit: `Environment=`, then its `EnvironmentFile=`
    files read on the host, which win (`env_file_values`)."""
    return {**unit.environment, **await env_file_values(transport, unit)}


async def env_file_values(transport: Transport, unit: UnitFile) -> dict[str, str]:
    """The variables of the unit's `EnvironmentFile=` files, read on the host in order (a `-` prefix
    makes a missing file harmless)."""
    env: dict[str, str] = {}
    for ref in environment_files(unit.entries):
        try:
            env.update(parse_env_file(await transport.read_file(ref.path), name=ref.path))
        except UnicodeDecodeError as e:
            raise ServiceError(f"EnvironmentFile={ref.path} is not UTF-8 text: {e}") from e
        except FileNotFoundError as e:
            if not ref.optional:
                raise ServiceError(
                    f"EnvironmentFile={ref.path} does not exist on the host (write it as "
                    f"EnvironmentFile=-{ref.path} if it is optional)"
                ) from e
    return env


@dataclass(frozen=True)
class _Process:
    argv: list[str]
    env: dict[str, str] | None
    """None when /proc/PID/environ cannot be read (another user's process, without sudo)."""
    identity: str
    started_at: float | None
    """When it started, on the host's wall clock."""
    changed_at: float | None
    """When the file last changed (ctime), on the host's wall clock."""


_READ = (
    'cat "/proc/$1/cmdline" || exit 3; printf "\\001"; cat "/proc/$1/environ" 2>/dev/null || printf "\\002";'
    ' printf "\\001"; sed "s/.*) //" "/proc/$1/stat" | cut -d " " -f 20; cut -d " " -f 1 /proc/uptime;'
    ' date +%s.%N; getconf CLK_TCK; stat -L -c %z -- "$2" 2>/dev/null; true'
)


def _ctime(text: str) -> float | None:
    """`stat -c %z` ("2026-05-09 12:00:00.123456789 +0000") as seconds since the epoch."""
    try:
        day, clock, zone = text.split()
        whole, _, frac = clock.partition(".")
        stamp = datetime.strptime(f"{day} {whole} {zone}", "%Y-%m-%d %H:%M:%S %z").timestamp()
        return stamp + float(f"0.{frac or 0}")
    except ValueError:
        return None


async def _read_process(transport: Transport, pid: int, path: str, *, sudo: bool) -> _Process | None:
    argv = ["sh", "-c", _READ, "sh", str(pid), path]
    result = await transport.run(["sudo", "-n", *argv] if sudo else argv)
    if not result.ok:
        return None
    cmdline, _, rest = result.stdout.partition("\x01")
    environ, _, clocks = rest.partition("\x01")
    lines = clocks.splitlines()
    env = None if environ == "\x02" else dict(v.split("=", 1) for v in environ.split("\0") if "=" in v)
    try:
        ticks, uptime, now, hz = int(lines[0]), float(lines[1]), float(lines[2]), int(lines[3])
        started: float | None = now - uptime + ticks / hz
    except (IndexError, ValueError, ZeroDivisionError):
        ticks, started = -1, None
    changed = _ctime(lines[4]) if len(lines) > 4 else None
    return _Process(cmdline.split("\0")[:-1], env, f"{pid} {ticks}", started, changed)


async def process_identity(transport: Transport, pid: int, *, sudo: bool = False) -> str | None:
    """`PID STARTTIME` of a running process (what a `StartRecord` holds), None if it is gone."""
    argv = ["sh", "-c", 'sed "s/.*) //" "/proc/$1/stat" | cut -d " " -f 20', "sh", str(pid)]
    result = await transport.run(["sudo", "-n", *argv] if sudo else argv)
    ticks = result.stdout.strip()
    return f"{pid} {ticks}" if result.ok and ticks.isdigit() else None


def _proven(text: str, proc: _Process, started: StartRecord | None) -> bool:
    """The process was started from `text`: optagent started it so, or the file is older than it."""
    if started is not None and started == StartRecord(sha(text), proc.identity):
        return True
    if proc.started_at is None or proc.changed_at is None:
        return False
    return proc.started_at > proc.changed_at + MARGIN_S


async def _shebang(transport: Transport, path: str) -> list[str] | None:
    """The words the kernel puts before a script's path when it runs it (`#!interp [arg]`)."""
    result = await transport.run(["head", "-c", "256", "--", path])
    line = result.stdout.split("\n", 1)[0] if result.ok else ""
    if not line.startswith("#!"):
        return None
    interp, _, arg = line[2:].strip().partition(" ")
    arg = arg.strip()
    if interp.rsplit("/", 1)[-1] == "env" and arg:  # `#!/usr/bin/env python3`: env runs python3
        words = arg.split()
        return words[1:] if words[0] == "-S" else words[:1]
    return [interp, arg] if arg else [interp]


async def _difference(transport: Transport, running: list[str], want: list[str]) -> tuple[bool, str]:
    """(whether the program is `want`'s, what differs: "" when nothing). The program may have been run
    through the interpreter of its `#!` line: `python3 /opt/venv/bin/sglang serve ...`."""
    offsets = [0] if running[:1] == want[:1] else []
    for k in (1, 2):
        path = running[k] if len(running) > k else ""
        named = bool(want) and (path == want[0] or ("/" not in want[0] and path.endswith("/" + want[0])))
        if named and await _shebang(transport, path) == running[:k]:
            offsets.append(k)
    if not offsets:
        shown = shlex.join(running[:1])
        return False, f"the service runs {shown}, the file asks for {shlex.join(want[:1])}"
    args, k = want[1:], offsets[0]
    if running[k + 1 :] == args:
        return True, ""
    at = next((i for i, (a, b) in enumerate(zip(running[k + 1 :], args, strict=False)) if a != b), None)
    at = min(len(args), len(running) - k - 1) if at is None else at
    flag = next((a for a in reversed(args[: at + 1]) if a.startswith("--")), None)
    where = f"from {flag.split('=', 1)[0]} on" if flag else f"from argument {at + 1} on"
    return True, f"its arguments differ from the file's {where}"


async def running_check(
    transport: Transport, pid: int, *, unit_path: str, sudo: bool = False, started: StartRecord | None = None
) -> RunCheck:
    """Whether process `pid` runs exactly what the file at `unit_path` asks for now (see the module
    docstring); `started` is optagent's record of its last restart, if any."""
    try:
        text = await transport.read_file(unit_path)
    except (FileNotFoundError, UnicodeDecodeError) as e:
        return RunCheck(None, f"{unit_path} cannot be read on the host ({type(e).__name__})")
    proc = await _read_process(transport, pid, unit_path, sudo=sudo)
    if proc is None:
        return RunCheck(None, f"/proc/{pid} cannot be read on the host")
    proven = _proven(text, proc, started)
    if unit_path.endswith(".sh"):
        if proven:
            return RunCheck(True)
        when = "changed after the service started" if _changed_after(proc) else "was not seen to start"
        return RunCheck(
            None, f"a launch script's content cannot be read from the process, and {unit_path} {when}"
        )
    try:
        unit = UnitFile.parse(text)
        want, want_env, _ = await unit_command(transport, text, unit_path=unit_path)
    except (ServiceError, UnitFileError, FileNotFoundError, UnicodeDecodeError) as e:
        return RunCheck(None, f"{unit_path} does not give a command to compare ({e})")
    if "@" in unit.prefix and proc.argv[:1] == [unit.words[1].value]:
        want = [unit.words[1].value, *want[1:]]  # systemd's `@`: the second word is argv[0]
    wrappers: list[str] = []
    why = ""
    while True:
        program, differs = await _difference(transport, proc.argv, want)
        if not differs:
            break
        why = differs if program or not why else why  # the closest match says best what differs
        peeled = exec_wrapper_end(want, 0)
        if peeled is None:
            return RunCheck(False, why)
        wrappers.append(shlex.join(want[: peeled[0]]))
        want, want_env = want[peeled[0] :], {**want_env, **peeled[1]}
    if proc.env is None:
        return RunCheck(
            None,
            f"the environment of process {pid} cannot be read (another user's: set sudo = true in [target])",
        )
    differ = sorted(k for k, v in want_env.items() if proc.env.get(k) != v)
    if differ:
        return RunCheck(False, f"its environment differs from the file's in {', '.join(differ)}")
    if wrappers and not proven:
        when = "changed after it started" if _changed_after(proc) else "was not seen to start"
        unseen = " ".join(wrappers)
        return RunCheck(
            None, f"the options of {unseen} cannot be read from the process, and {unit_path} {when}"
        )
    return RunCheck(True)


def _changed_after(proc: _Process) -> bool:
    return proc.started_at is not None and proc.changed_at is not None and proc.changed_at >= proc.started_at


async def running_matches(
    transport: Transport, pid: int, *, unit_path: str, sudo: bool = False, started: StartRecord | None = None
) -> bool | None:
    """`running_check(...).matches`."""
    return (await running_check(transport, pid, unit_path=unit_path, sudo=sudo, started=started)).matches
