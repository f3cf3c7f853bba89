"""Restoring known-good, recovering an interrupted deploy, and the target's status (for `deployment.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any, Protocol

from tools.deploy.health import HealthResult, wait_healthy
from tools.deploy.journal import DAY_S, Journal, JournalEntry, save_state, sha
from tools.deploy.outcome import DeployError, DeployOutcome, DriftError
from tools.deploy.remote import TransportError
from tools.deploy.running import RunCheck
from tools.deploy.serverlog import error_line, readable_tail
from tools.deploy.service import ServiceError
from tools.deploy.units.file import UnitFile, UnitFileError, unified_diff
from tools.redact import redact_flags, redact_text

if TYPE_CHECKING:
    from tools.config import TargetConfig
    from tools.deploy.deadman import DeadmanSwitch
    from tools.deploy.lock import HostLock
    from tools.deploy.remote import Transport
    from tools.deploy.service import ServiceManager


class DeploymentParts(Protocol):
    """What these functions use of a `tools.deploy.deployment.Deployment`, which imports this module
    (so it is described here, never imported); its private steps are the gate's own, done for it."""

    target: TargetConfig
    transport: Transport
    journal: Journal
    manager: ServiceManager
    deadman: DeadmanSwitch
    lock: HostLock
    remote_unit: str
    run_dir: str

    def parse(self, text: str) -> UnitFile: ...
    async def host_unit(self, text: str) -> UnitFile: ...
    async def remote_text(self) -> str: ...
    async def known_good(self, *, unproven_ok: bool = False) -> str: ...
    async def log_tail(self, lines: int = 40) -> str: ...
    async def rollback(self) -> DeployOutcome: ...
    async def _restart(self, *, restoring: bool = False) -> None: ...
    async def _wait(self) -> HealthResult: ...
    async def _finish_commit(self) -> None: ...


__all__ = ["after_failed_deploy", "check_running", "config_check", "recover", "restore_known_good", "status"]

_AFTER_RESTART = ("restart", "wait", "healthy")


async def config_check(d: DeploymentParts) -> RunCheck:
    """Whether the service runs exactly its unit file as it is now (`running.running_check`, with
    optagent's record of its last restart); unknown when the service manager cannot tell."""
    check = getattr(d.manager, "config_check", None)
    if check is None:
        return RunCheck(None, "the service manager cannot compare the running process with the file")
    return await check(started=d.journal.started())


async def check_running(d: DeploymentParts, text: str, source: object, *, unproven_ok: bool = False) -> bool:
    """Refuse to record `text` as known-good unless the host's unit file is `text`, the service runs
    exactly that (its whole command line and environment, a launch script proven by a restart) and it
    is healthy; nothing is changed. True: record it. False (only with `unproven_ok`): the service is not
    running; do not record it yet."""
    remote = await d.remote_text()
    never = "optagent records as known-good only a configuration it has seen running and healthy"
    if remote != text:
        raise DriftError(
            f"{source} differs from {d.remote_unit} on the host; nothing was recorded or changed. "
            f"Differences:\n{unified_diff(remote, text, name=d.target.service)}"
        )
    if not await d.manager.is_active():
        if unproven_ok:
            return False
        raise DeployError(
            f"the service {d.target.service} is not running, so {d.remote_unit} was never seen serving; "
            f"{never}. Start it and retry (nothing was changed)"
        )
    check = await config_check(d)
    if check.matches is False:
        raise DeployError(
            f"{d.remote_unit} on the host is not what the service runs ({check.why}): the file was edited "
            f"after the service started; {never}. If the file is right, restart the service yourself; "
            "otherwise put back the file it runs. Nothing was changed"
        )
    if check.matches is None:
        raise DeployError(
            f"optagent cannot tell whether the service runs {d.remote_unit} as it is now ({check.why}); "
            f"{never}. If the file is right, restart the service yourself and retry once it serves; "
            "otherwise put back the file it runs. Nothing was changed"
        )
    t = d.target
    health = await wait_healthy(t.endpoint, timeout=min(30.0, t.health_timeout_s), api_key=t.api_key)
    if not health.ok and not unproven_ok:
        raise DeployError(
            f"the service runs {d.remote_unit} but is not healthy ({health.reason}); {never}. "
            "Nothing was changed"
        )
    return health.ok


async def _wait_while_firing(d: DeploymentParts, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while await d.deadman.is_firing() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)


async def after_failed_deploy(
    d: DeploymentParts, error: str, health: HealthResult, diff: str, timings: dict[str, float], start: float
) -> DeployOutcome:
    """A candidate that did not come up healthy: what the server said (its log's own reason, not
    its kilobytes of arguments), known-good restored, and the outcome that says both."""
    raw_log = await d.log_tail()
    said = error_line(raw_log)
    error = f"{error}; the server said: {said}" if said else error
    log_tail = readable_tail(raw_log, lines=40)
    with contextlib.suppress(OSError):  # a full disk must not keep the host from known-good
        d.journal.record(failure=True)
    rollback = await d.rollback()
    if not rollback.ok:
        error += f"; ROLLBACK FAILED: {rollback.error}"
    return DeployOutcome(
        False,
        error,
        log_tail,
        time.monotonic() - start,
        diff,
        rolled_back=True,
        health=health,
        timings=timings,
        restored=rollback.ok,
    )


async def restore_known_good(
    d: DeploymentParts, entry: JournalEntry | None, *, fired: bool = False
) -> DeployOutcome:
    """Put the known-good file back, restart if the server may run anything else, verify, close the journal."""
    start = time.monotonic()
    known_good = d.journal.known_good() or await d.known_good(unproven_ok=True)
    try:
        remote = await d.transport.read_file(d.remote_unit)
    except FileNotFoundError:
        remote = None
    changed_file = remote != known_good
    if changed_file:  # before disarming: a candidate never stays on the host without the switch
        await d.transport.write_file_atomic(d.remote_unit, known_good)  # (a firing switch writes the same)
    fired = fired or not await d.deadman.disarm()
    await _wait_while_firing(d)
    steps = [*(entry.history if entry else []), entry.step if entry else ""]
    restarted_with_candidate = any(s in _AFTER_RESTART for s in steps) and not fired
    active = await d.manager.is_active()
    runs = (await config_check(d)).matches if active else None
    # After a restart with the candidate, only a process proven to run known-good is left running
    # (e.g. the candidate's restart never happened: a full local disk stopped it first).
    need_restart = not active or runs is False or (restarted_with_candidate and runs is not True)
    if need_restart:
        await d._restart(restoring=True)
    elif changed_file:
        await d.manager.reload()
    health = await d._wait()
    if not health.ok and not need_restart:
        await d._restart(restoring=True)
        health = await d._wait()
    raw_log = "" if health.ok else await d.log_tail()
    if health.ok and d.journal.known_good() is None:  # brought back from the host's file and serving
        d.journal.set_known_good(known_good)
    d.journal.close()
    said = error_line(raw_log)
    error = "" if health.ok else f"the known-good configuration is not healthy: {health.reason}"
    error += f"; the server said: {said}" if said and not health.ok else ""
    log_tail = readable_tail(raw_log, lines=40)
    return DeployOutcome(
        health.ok,
        error,
        log_tail,
        time.monotonic() - start,
        changed=True,
        rolled_back=True,
        health=health,
        restored=health.ok,
    )


async def remove_temp_files(d: DeploymentParts) -> None:
    """Delete temp files a killed optagent may have left (only called while holding the lock)."""
    unit_dir, name = d.remote_unit.rsplit("/", 1)
    lock = d.lock.path
    script = (
        'rm -f "$1"/."$2".*.optagent-tmp "$1/$2".optagent-deadman-tmp "$1/$2".optagent-deadman-tmp.* '
        '"$3"/.*.optagent-tmp "$3"/*.tmp.?????? "$3"/backups/.*.optagent-tmp "$4".*.tmp "$4".stale-*'
    )
    await d.transport.run(["sh", "-c", script, "sh", unit_dir, name, d.run_dir, lock])
    for directory in {d.journal.dir, d.target.local_unit.parent}:
        for path in directory.glob(".*.optagent-tmp") if directory.exists() else []:
            path.unlink(missing_ok=True)


async def recover(d: DeploymentParts) -> str | None:
    """Finish or undo an interrupted deploy, or restart a server whose config does not match its file."""
    await remove_temp_files(d)
    entry = d.journal.read()
    if entry is None:
        known_good = d.journal.known_good()
        try:
            remote = await d.transport.read_file(d.remote_unit)
        except FileNotFoundError:
            return None
        if known_good is None or remote != known_good or (await config_check(d)).matches is not False:
            return None
        try:
            d.parse(remote)
        except UnitFileError as e:  # restarting would stop a running server and never start it
            return f"the unit file on the host does not parse ({e}); left the running server alone"
        await d._restart()
        health = await d._wait()
        note = "" if health.ok else f", but it is not healthy: {health.reason}"
        return f"the running server did not match its unit file; restarted it{note}"
    if entry.step == "commit":
        try:
            await d._finish_commit()
            return f"completed the interrupted commit of {entry.id}"
        except DeployError as e:  # e.g. the local unit directory became read-only: undo instead
            outcome = await restore_known_good(d, entry)
            note = "" if outcome.ok else f", but it is not healthy: {outcome.error}"
            return f"could not finish the interrupted commit of {entry.id} ({e}); restored the known-good configuration{note}"
    outcome = await restore_known_good(d, entry)
    note = "" if outcome.ok else f", but it is not healthy: {outcome.error}"
    return f"restored the known-good configuration after an interrupted deploy ({entry.id}, at step {entry.step}){note}"


async def status(d: DeploymentParts) -> dict[str, Any]:
    """What runs on the target, whether it is healthy, and optagent's own state for it."""
    t = d.target
    info: dict[str, Any] = {
        "target": d.transport.description,
        "service": t.service,
        "service_manager": t.service_manager,
        "remote_unit": d.remote_unit,
        "local_unit": str(t.local_unit),
        "endpoint": redact_text(t.endpoint, secrets=[t.api_key]),  # no `user:password@`
    }
    known_good = d.journal.known_good()
    remote: str | None = None
    try:
        remote = await d.transport.read_file(d.remote_unit)
        info["deployed_sha"] = sha(remote)
        unit = await d.host_unit(remote)  # the flags the server gets, `$VAR`s expanded
        info["deployed_flags"] = redact_flags(unit.command.flags, secrets=[t.api_key])
    except FileNotFoundError:
        info["deployed_flags"], info["deployed_sha"] = None, None
    except (UnitFileError, ServiceError) as e:
        info["deployed_flags"] = f"unparseable: {e}"
    info["known_good_sha"] = sha(known_good) if known_good is not None else None
    info["drift"] = known_good is not None and remote is not None and remote != known_good
    try:
        info["active"] = await d.manager.is_active()
        check = await config_check(d)
        verdict = "no" if check.matches is False else "unknown"
        info["config_matches_file"] = True if check.matches else f"{verdict}: {check.why}"
    except (TransportError, ServiceError) as e:
        info["active"], info["config_matches_file"] = None, f"unknown: {e}"
    health = await wait_healthy(t.endpoint, timeout=3.0, request_timeout=3.0, api_key=t.api_key)
    info["health"] = {"ok": health.ok, "reason": health.reason, "seconds": round(health.seconds, 3)}
    holder = await d.lock.holder()
    mine = holder is not None and d.lock.owner is not None and holder.token == d.lock.owner.token
    info["lock"] = holder.describe() if holder and not mine else None  # `status` itself is no holder
    entry = d.journal.read()
    info["journal"] = {"id": entry.id, "step": entry.step, "reason": entry.reason} if entry else None
    info["deadman"] = (
        "armed" if await d.deadman.is_armed() else "fired" if await d.deadman.fired() else "disarmed"
    )
    counters, now = d.journal.counters(), time.time()
    info["restarts_last_minute"] = len([x for x in counters["restarts"] if now - x < 60])
    day = len([x for x in counters["restarts"] if now - x < DAY_S])
    info["restarts_last_day"] = f"{day} (max {t.max_restarts_per_day})"
    if damaged := [x for x in counters["damaged"] if now - x < DAY_S]:
        info["restarts_last_day"] = (
            f"unknown: {d.journal.counters_path} was found damaged {(now - max(damaged)) / 60:.0f} min ago "
            f"(set aside as counters.unreadable-*.json); the day's budget counts as spent "
            f"(max {t.max_restarts_per_day})"
        )
    info["consecutive_failures"] = len(counters["failures"])
    return info


async def finish_commit(d: DeploymentParts) -> None:
    """Disarm the switch, then make the candidate known-good locally and on the host; close the journal.

    A switch that already fired means the host went back to known-good: say so. A local file that
    cannot be written raises `DeployError` (the caller then undoes the candidate instead)."""

    if not await d.deadman.disarm():
        await restore_known_good(d, d.journal.read(), fired=True)
        raise DeployError(
            "the dead-man's switch fired before the commit; the host runs the known-good config"
        )
    candidate = d.journal.candidate()
    if candidate is None:
        raise DeployError(f"the candidate copy {d.journal.candidate_path} is missing; cannot commit")
    try:
        save_state(d.target.local_unit, candidate)
        d.journal.set_known_good(candidate)
    except OSError as e:
        raise DeployError(f"cannot finish the commit: {e}") from e
    await d.transport.write_file_atomic(d.deadman.known_good_path, candidate)
    d.journal.record(failure=False)
    d.journal.close()


async def backup_unit(d: DeploymentParts, *, keep: int) -> None:
    """Copy the host's unit file to a timestamped backup (temp file + rename), keep the newest `keep`."""
    stamp = time.strftime("%Y%m%dT%H%M%S") + f"-{time.time_ns() % 10**6:06d}"
    name = d.remote_unit.rsplit("/", 1)[-1]
    script = (
        '(umask 077 && mkdir -p "$2") && rm -f "$2/.$3.optagent-tmp" && cp -p "$1" "$2/.$3.optagent-tmp" && '
        'chmod go-w "$2/.$3.optagent-tmp" && mv -f "$2/.$3.optagent-tmp" "$2/$3" && '
        f'ls -1t "$2" | tail -n +{keep + 1} | while read -r f; do rm -f "$2/$f"; done'
    )
    await d.transport.run(
        ["sh", "-c", script, "sh", d.remote_unit, f"{d.run_dir}/backups", f"{name}.{stamp}"], check=True
    )
