"""What a unit file asks the host to run, and whether the running process is that (below `service.py`).

A unit file edited on the host but never restarted parses fine while the old process still serves:
only the process's own command line and environment (`/proc/PID/cmdline`, `/proc/PID/environ`) say
what really runs. Both service managers compare them with the unit file through `running_matches`.
"""

from __future__ import annotations

from tools.deploy.transport import Transport
from tools.deploy.units.envfile import environment_files, parse_env_file
from tools.deploy.units.file import UnitFile, UnitFileError

__all__ = ["ServiceError", "running_matches", "unit_command"]


class ServiceError(Exception):
    """The service manager could not do what was asked; the message says what failed."""


async def unit_command(
    transport: Transport, text: str, *, unit_path: str
) -> tuple[list[str], dict[str, str], str]:
    """(argv, environment, working directory) that the unit text `text` (installed at `unit_path`) asks for.

    `EnvironmentFile=` files are read on the host and override `Environment=`, as systemd does.
    """
    unit = UnitFile.parse(text, kind="script" if unit_path.endswith(".sh") else None)
    if unit.kind == "script":
        return ["sh", unit_path], {}, "."
    env = dict(unit.environment)
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
    argv = unit.exec_argv(env)
    if "=" in argv[0]:
        raise ServiceError(f"executable {argv[0]!r} contains '='; refusing to run it")
    return argv, env, unit.working_directory or "."


async def running_matches(
    transport: Transport, pid: int, *, unit_path: str, sudo: bool = False
) -> bool | None:
    """Whether process `pid` runs what the unit file at `unit_path` asks for now: its arguments end
    with the unit's and its environment holds the unit's. None when it cannot be told (the process
    is gone, its /proc is unreadable, or the file is missing or does not parse), and for a launch
    script: what it ends up running (after its variables, an `exec` or a child) is not in the file."""
    if unit_path.endswith(".sh"):
        return None
    script = 'cat "/proc/$1/cmdline" && printf "\\001" && cat "/proc/$1/environ"'
    argv = (
        ["sudo", "-n", "sh", "-c", script, "sh", str(pid)] if sudo else ["sh", "-c", script, "sh", str(pid)]
    )
    result = await transport.run(argv)
    if not result.ok:
        return None
    cmdline, _, environ = result.stdout.partition("\x01")
    running, env = cmdline.split("\0")[:-1], set(environ.split("\0"))
    try:
        want, want_env, _ = await unit_command(
            transport, await transport.read_file(unit_path), unit_path=unit_path
        )
    except (ServiceError, UnitFileError, FileNotFoundError, UnicodeDecodeError):
        return None  # unknown: a file that does not parse must never trigger a restart
    args = want[1:]
    same_args = running[len(running) - len(args) :] == args if args else True
    return same_args and all(f"{k}={v}" in env for k, v in want_env.items())
