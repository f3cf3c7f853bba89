"""What a deploy checks before the host changes: the candidate parses and can start, the restart
rate limit, room to write, and the host still runs known-good (takes a `Deployment`, never imports
it). Moved from `deployment.py`."""

from __future__ import annotations

import asyncio
from pathlib import Path, PurePosixPath
from typing import Any

from tools.deploy.dirtrust import unwritable_dirs
from tools.deploy.flagbounds import value_problems
from tools.deploy.limits import check_limits
from tools.deploy.outcome import DeployError, DriftError
from tools.deploy.service import ServiceError
from tools.deploy.units.file import UnitFileError, unified_diff


async def before_deploy(d: Any, new_text: str) -> str:
    """Refuse `new_text` before anything on the host changes (`DeployError`, or `DriftError` when
    the host's unit file is no longer known-good); returns the known-good text. With `d.pace` a
    deploy over the restart rate limit waits until it is within it."""
    if d.journal.read() is not None:
        raise DeployError("a candidate is already in flight; commit() or rollback() it first")
    try:
        flags = d.parse(new_text).command.flags
    except UnitFileError as e:
        raise DeployError(f"the candidate unit file is invalid: {e}") from e
    if problems := value_problems(flags):  # e.g. --tp-size 0: two restarts for nothing
        raise DeployError(f"the candidate cannot be started: {'; '.join(problems)} (nothing was changed)")
    resolve = getattr(d.manager, "command_for", None)
    if resolve is not None:  # e.g. a missing EnvironmentFile=: refuse before the host changes
        try:
            await resolve(new_text)
        except (ServiceError, UnitFileError) as e:
            raise DeployError(f"the candidate cannot be started: {e}") from e
    if d.pace and (wait := d.restart_wait()) > 0:
        d._progress("rate-limit", 0.0, wait)
        await asyncio.sleep(wait + 0.5)  # the timer may fire a hair before the wall clock agrees
    check_limits(d.journal, d.target)
    known_good = await d.known_good()
    await check_writable(d, need=3 * (len(new_text.encode()) + len(known_good.encode())) + 16384)
    remote = await d.remote_text()
    if remote != known_good:
        raise DriftError(
            f"{d.remote_unit} on the host differs from the last deployed configuration; nothing was "
            f"changed. Differences:\n{unified_diff(known_good, remote, name=d.target.service)}"
        )
    return known_good


def local_dirs(d: Any) -> list[Path]:
    """The local directories a deploy and its commit write to: the unit file's and the state dir."""
    return [Path(d.target.local_unit).expanduser().parent, Path(d.target.state_dir)]


async def check_writable(d: Any, *, need: int) -> None:
    """Every directory a deploy and its commit write to, locally and on the host, takes `need` bytes
    (what the deploy writes there, and a copy during each atomic replace); checked before the
    host is touched, so a full disk stops the deploy before it starts, never halfway."""
    remote_dirs = [str(PurePosixPath(d.remote_unit).parent), d.run_dir, f"{d.run_dir}/backups"]
    bad = await unwritable_dirs(d.transport, local_dirs(d), remote_dirs, need=need)
    if bad:
        raise DeployError(f"cannot write to {', '.join(bad)}; nothing was changed")
