"""The one gate that changes the target: lock, journal, arm the dead-man's switch, upload, restart, verify.

    async with Deployment(target) as d:          # lock on the host + recovery of an unfinished journal
        outcome = await d.deploy(new_text)       # on failure it has already rolled back
        if outcome.ok:
            await d.commit()                     # candidate becomes known-good; local unit file written

Whatever happens (a candidate that never gets healthy, a dropped connection, optagent killed), the
next command restores the known-good configuration, and the host's dead-man's switch does so even
if optagent never runs again. Restoring and status live in `tools.deploy.restore`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from tools.deploy import precheck, restore
from tools.deploy.deadman import DeadmanSwitch
from tools.deploy.dirtrust import UntrustedDirError, trusted_dirs, unwritable_local
from tools.deploy.health import HealthResult, wait_healthy
from tools.deploy.journal import Journal, JournalEntry, StartRecord, save_state, sha
from tools.deploy.limits import restart_wait
from tools.deploy.lock import HostLock, LockedError
from tools.deploy.outcome import DeployError, DeployOutcome, DriftError, UnitInvalidError
from tools.deploy.remote import Transport, TransportError, make_transport
from tools.deploy.running import env_file_values
from tools.deploy.service import ServiceError, ServiceManager, make_service_manager
from tools.deploy.units.file import UnitFile, UnitFileError, unified_diff

if TYPE_CHECKING:
    from tools.config import TargetConfig

__all__ = ["DeployError", "DeployOutcome", "Deployment", "DriftError", "LockedError", "UnitInvalidError"]

ProgressFn = Callable[[str, float, float | None], None]
"""on_progress(phase, elapsed_s, total_s or None)."""
KEEP_BACKUPS = 20
START_MARGIN = 2.0
"""A start may take this many times the slowest start seen in the session before it counts as failed
(`Deployment.health_wait`), when that is longer than `health_timeout_s`."""
DEADMAN_MIN_FACTOR = 1.5
"""The switch is armed for max(deadman_s, 1.5 x the health wait), so a slow start never trips it;
a caller that benchmarks longer than that calls `keepalive()` while it works."""


class Deployment:
    """Changes one target safely; use as `async with Deployment(target) as d`."""

    def __init__(
        self,
        target: TargetConfig,
        *,
        transport: Transport | None = None,
        on_progress: ProgressFn | None = None,
        command: str = "optagent",
        pace: bool = False,
    ) -> None:
        """`pace`: a deploy over the restart rate limit waits until it is within it (a run's trials)
        instead of being refused (a one-off `optagent deploy`)."""
        self.target, self.on_progress, self.command, self.pace = target, on_progress, command, pace
        self.transport: Transport = transport or make_transport(target)
        self.journal = Journal(target.state_dir)
        self.recovered: str | None = None
        self.starts: list[float] = []
        """Seconds each healthy start of this session took (restart to healthy): `health_wait`."""
        self._opened = False

    # --- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Resolve the host paths and build the service manager, the lock and the dead-man's switch."""
        if self._opened:
            return
        run_dir, unit_dir = await self._trusted_dirs()
        self.remote_unit = f"{unit_dir}/{PurePosixPath(self.target.remote_unit).name}"
        self.run_dir = run_dir
        self.target = self.target.model_copy(update={"run_dir": run_dir, "remote_unit": self.remote_unit})
        self.manager: ServiceManager = make_service_manager(self.target, self.transport)
        self.deadman = DeadmanSwitch(
            self.transport,
            self.manager,
            run_dir=run_dir,
            unit_path=self.remote_unit,
            service=self.target.service,
        )
        self.lock = HostLock(self.transport, f"{run_dir}/{self.target.service}.lock", command=self.command)
        self._opened = True

    async def _trusted_dirs(self) -> tuple[str, str]:
        t = self.target
        try:
            return await trusted_dirs(
                self.transport, run_dir=t.run_dir, remote_unit=t.remote_unit, state_dir=t.state_dir
            )
        except (UntrustedDirError, OSError) as e:
            raise DeployError(str(e)) from e

    async def __aenter__(self) -> Deployment:
        try:
            await self.open()
            await self.lock.acquire()
        except BaseException:
            await self.transport.close()
            raise
        try:
            self.recovered = await self.recover()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            entry = self.journal.read()
            if entry is not None:  # a candidate never outlives the session that deployed it
                await self.rollback()  # (an unfinished commit is finished, or else undone)
        finally:
            await self.close()

    async def close(self) -> None:
        """Release the lock and the connection."""
        try:
            if self._opened:
                await self.lock.release()
        finally:
            await self.transport.close()

    def _progress(self, phase: str, elapsed: float = 0.0, total: float | None = None) -> None:
        if self.on_progress is not None:
            self.on_progress(phase, elapsed, total)

    # --- texts ---------------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        """`script` for a `.sh` launch script, else `systemd`."""
        return "script" if self.remote_unit.endswith(".sh") else "systemd"

    def parse(self, text: str) -> UnitFile:
        """Parse a unit text of this target's kind."""
        return UnitFile.parse(text, kind=self.kind)  # type: ignore[arg-type]

    async def host_unit(self, text: str) -> UnitFile:
        """`text` parsed as the server gets it: a unit's `$NAME`s with its `EnvironmentFile=` values,
        read on the host (`ServiceError` when a file it names is missing)."""
        unit = self.parse(text)
        if unit.kind == "script" or not unit.unknown_words:
            return unit
        return UnitFile.parse(text, kind="systemd", env=await env_file_values(self.transport, unit))

    async def remote_text(self) -> str:
        """The unit file on the host."""
        try:
            return await self.transport.read_file(self.remote_unit)
        except FileNotFoundError as e:
            raise DeployError(f"{self.remote_unit}: no unit file on the host") from e
        except UnicodeDecodeError as e:
            raise UnitInvalidError(
                f"{self.remote_unit} on the host is not UTF-8 text ({e.reason}); fix it"
            ) from e

    async def known_good(self, *, unproven_ok: bool = False) -> str:
        """The known-good text: recorded in `state_dir`, else the local unit file, else the host's file.

        A text is recorded only once the service is seen running it, healthy (`restore.check_running`);
        `unproven_ok` (bringing a dead server back) returns the host's text unrecorded when the service
        is not running: nothing runs that it could be compared with."""
        recorded = self.journal.known_good()
        try:
            local = self.target.local_unit.read_text() if self.target.local_unit.exists() else None
        except UnicodeDecodeError as e:
            raise UnitInvalidError(f"{self.target.local_unit} is not UTF-8 text ({e.reason}); fix it") from e
        if recorded is None:
            recorded = local if local is not None else await self.remote_text()
            source = self.target.local_unit if local is not None else self.remote_unit
            self._check_parses(recorded, source)  # never record a file no restart could use
            if await restore.check_running(self, recorded, source, unproven_ok=unproven_ok):
                self.journal.set_known_good(recorded)  # never one that was not seen serving
        if local is None:
            save_state(self.target.local_unit, recorded)
        elif local != recorded:
            raise DriftError(
                f"the local unit file {self.target.local_unit} was edited since the last deploy; the known-good "
                f"copy is {self.journal.known_good_path}:\n{unified_diff(recorded, local, name='local')}"
            )
        return recorded

    def _check_parses(self, text: str, source: object) -> None:
        try:
            self.parse(text)
        except UnitFileError as e:
            raise UnitInvalidError(f"{source}: {e}; fix the file (nothing was changed)") from e

    # --- deploy, commit, rollback ---------------------------------------------------------------

    def restart_wait(self) -> float:
        """Seconds until a deploy is within the restart rate limit (0: now). A caller that paces
        itself waits this long instead of being refused."""
        return restart_wait(self.journal, self.target)

    async def deploy(self, new_text: str, *, reason: str = "") -> DeployOutcome:
        """Upload `new_text`, restart, wait healthy; on failure roll back and say why (with log lines)."""
        start = time.monotonic()
        if self.lock.lost:  # someone removed or broke it meanwhile: another optagent may be deploying
            raise DeployError(
                f"this optagent no longer holds the lock {self.lock.path} (it was removed or broken): "
                "nothing was changed; run this again"
            )
        known_good = await precheck.before_deploy(self, new_text)
        diff = unified_diff(known_good, new_text, name=PurePosixPath(self.remote_unit).name)
        if new_text == known_good:
            return DeployOutcome(ok=True, diff="", changed=False, seconds=time.monotonic() - start)
        entry = self.journal.open(candidate=new_text, known_good=known_good, reason=reason)
        timings: dict[str, float] = {}
        error, health = "", None
        try:
            await self._timed(timings, "backup", entry, self._backup())
            # Armed before the upload: a candidate is never on the host without the switch behind it.
            await self._timed(timings, "arm", entry, self.deadman.arm(known_good, self.deadman_seconds))
            await self._timed(
                timings, "upload", entry, self.transport.write_file_atomic(self.remote_unit, new_text)
            )
            await self._timed(timings, "restart", entry, self._restart())
            health = await self._timed(timings, "wait", entry, self._wait())
            if health.ok:
                self.journal.step(entry, "healthy")
                self._progress("healthy")  # ends a "waiting for the server" display
                timings["total"] = time.monotonic() - start
                return DeployOutcome(
                    True, diff=diff, seconds=timings["total"], health=health, timings=timings
                )
            error = health.reason
        except (TransportError, ServiceError, UnitFileError, OSError) as e:
            error = str(e)
        return await restore.after_failed_deploy(self, error, health, diff, timings, start)

    @property
    def health_wait(self) -> float:
        """How long a start may take before it counts as failed: `health_timeout_s`, or more once this
        server was seen to start slowly (START_MARGIN x its slowest healthy start here): a configured
        figure below what this server really takes would fail every candidate that starts a little
        slower than known-good."""
        return max(self.target.health_timeout_s, START_MARGIN * max(self.starts, default=0.0))

    @property
    def deadman_seconds(self) -> float:
        """How long the switch waits: `deadman_s`, but never less than 1.5 x `health_wait`."""
        return max(self.target.deadman_s, DEADMAN_MIN_FACTOR * self.health_wait)

    async def keepalive(self) -> bool:
        """Push the dead-man's deadline to `deadman_seconds` from now (one remote command); call it while a
        trial is still making progress. False when no candidate is in flight or the switch already fired."""
        entry = self.journal.read()
        if entry is None or entry.step not in ("restart", "wait", "healthy"):
            return False
        return await self.deadman.extend(self.deadman_seconds)

    async def _timed(self, timings: dict[str, float], step: str, entry: JournalEntry, awaitable: Any) -> Any:
        self.journal.step(entry, step)
        self._progress(step)
        t0 = time.monotonic()
        try:
            return await awaitable
        finally:
            timings[step] = time.monotonic() - t0

    async def _backup(self) -> None:
        await restore.backup_unit(self, keep=KEEP_BACKUPS)

    async def _restart(self, *, restoring: bool = False) -> None:
        """Restart on the host's unit file and record what was started (`StartRecord`). A restart that
        cannot be counted (a full local disk) is not made, unless it brings known-good back."""
        # A unit that does not parse would stop the server and never start it again: refuse first.
        text = await self.remote_text()
        self._check_parses(text, self.remote_unit)
        try:
            self.journal.record(restart=True)
        except OSError:
            if not restoring:
                raise
        await self.manager.reload()
        await self.manager.restart()
        identity = getattr(self.manager, "identity", None)
        process = await identity() if identity is not None else None
        with contextlib.suppress(OSError):  # only a proof for later; a full disk must not stop a restore
            self.journal.set_started(StartRecord(sha(text), process) if process else None)

    async def _wait(self) -> HealthResult:
        health = await wait_healthy(
            self.target.endpoint,
            timeout=self.health_wait,
            is_alive=self.manager.is_active,
            api_key=self.target.api_key,
            on_progress=lambda elapsed, total, phase: self._progress(f"wait:{phase}", elapsed, total),
        )
        if health.ok:
            self.starts.append(health.seconds)
        return health

    async def log_tail(self, lines: int = 40) -> str:
        """The service log's last `lines` lines, or a note of why it could not be read."""
        try:
            return await self.manager.logs(lines)
        except (TransportError, ServiceError, OSError) as e:
            return f"(could not read the service log: {e})"

    async def commit(self) -> None:
        """Keep the healthy candidate: it becomes known-good and the local unit file takes its text.

        If the local files cannot be written the commit is refused before it starts (the session
        then rolls the candidate back), never left half-done."""
        entry = self.journal.read()
        if entry is None or entry.step not in ("healthy", "commit"):
            raise DeployError("nothing healthy to commit (deploy a candidate first)")
        candidate = self.journal.candidate() or ""
        bad = unwritable_local(precheck.local_dirs(self), need=2 * len(candidate.encode()) + 8192)
        if bad:
            raise DeployError(
                f"cannot commit: cannot write to {', '.join(bad)}; the candidate will be rolled back"
            )
        self.journal.step(entry, "commit")
        await self._finish_commit()

    async def _finish_commit(self) -> None:
        await restore.finish_commit(self)

    async def rollback(self) -> DeployOutcome:
        """Restore known-good, restart, verify healthy; changes nothing when nothing is in flight."""
        entry = self.journal.read()
        if entry is None:
            health = await wait_healthy(
                self.target.endpoint, timeout=3.0, request_timeout=3.0, api_key=self.target.api_key
            )
            if health.ok:
                return DeployOutcome(ok=True, changed=False, health=health)
            self._progress("rollback")  # nothing in flight, but the server is down: bring known-good back
            return await restore.restore_known_good(self, None)
        if entry.step == "commit":
            try:
                await self._finish_commit()
                return DeployOutcome(ok=True, changed=False, error="the change was already being committed")
            except DeployError:
                pass  # it cannot be finished (a path became read-only): undo it instead
        with contextlib.suppress(OSError):  # the state dir may be full: restore the host all the same
            self.journal.step(entry, "rollback")
        self._progress("rollback")
        return await restore.restore_known_good(self, entry)

    async def recover(self) -> str | None:
        """Finish or undo an interrupted deploy; None when there was nothing to do."""
        return await restore.recover(self)

    async def status(self) -> dict[str, Any]:
        """Deployed flags, health, lock, journal state, known-good version (a JSON-able dict)."""
        await self.open()
        return await restore.status(self)
