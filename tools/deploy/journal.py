"""The intent journal: what a deploy is about to do, written and fsynced before each step.

It lives in the target's local `state_dir` with the known-good and candidate unit texts, so any
later optagent command can finish or undo an interrupted deploy. Small persistent counters (recent
restarts, consecutive failed candidates) live beside it in `counters.json`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tools.deploy.remote import write_local_atomic

__all__ = [
    "MAX_STATE_BYTES",
    "STEPS",
    "DamagedStateError",
    "Journal",
    "JournalEntry",
    "StartRecord",
    "StateWriteError",
    "read_state",
    "sha",
]

STEPS = ("begin", "backup", "arm", "upload", "restart", "wait", "healthy", "commit", "rollback")
"""Each is journaled before it is taken; `healthy` means the candidate serves and awaits commit."""
FAULT_ENV = "OPTAGENT_FAULT_KILL_AT"
"""Fault injection for the crash tests: SIGKILL this process right after journaling that step."""


DAY_S = 86400.0
MAX_KEPT = 10000
"""Restart times kept in counters.json: those of the last `DAY_S`, at most this many."""
MAX_STATE_BYTES = 1 << 20
"""A state file larger than this was not written by optagent (unit files are a few kB)."""


def sha(text: str | bytes) -> str:
    """Short content hash of a unit file text."""
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()[:16]


class DamagedStateError(Exception):
    """A state file optagent cannot have written: too large, not UTF-8, unreadable."""

    def __init__(self, why: str, data: bytes = b"") -> None:
        super().__init__(why)
        self.why, self.data = why, data


class StateWriteError(OSError):
    """A file in the state dir (or the local unit copy) could not be written; says which, and what to do."""

    def __str__(self) -> str:
        return f"cannot write {self.filename} on this machine: {self.strerror}"


def save_state(path: Path, text: str) -> None:
    """Write a state file atomically; a failure (a full disk) names the file and what to do next."""
    try:
        write_local_atomic(path, text)
    except OSError as e:
        what = e.strerror or str(e)
        advice = "free space there (or make it writable), then run `optagent recover`"
        raise StateWriteError(e.errno or 0, f"{what}; {advice}", str(path)) from e


def read_state(path: Path) -> str | None:
    """The text of a state file, None if absent; `DamagedStateError` if it is oversized, not UTF-8
    or cannot be read. Never reads more than `MAX_STATE_BYTES` (+1)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise DamagedStateError(f"cannot be read ({e.strerror or e})") from e
    if len(data) > MAX_STATE_BYTES:
        raise DamagedStateError(f"is larger than {MAX_STATE_BYTES} bytes", data)
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise DamagedStateError(f"is not UTF-8 text ({e.reason} at byte {e.start})", data) from e


def _finite(value: object, low: float, high: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high


@dataclass(frozen=True)
class StartRecord:
    """optagent's record of a restart it made: the hash of the file it started the service from and
    the process that started (`PID STARTTIME`, the start time in clock ticks since boot as in
    /proc/PID/stat). It proves what a process cannot show: a launch script's content, a wrapper's
    options (`tools.deploy.running`)."""

    sha: str
    process: str


@dataclass
class JournalEntry:
    """One in-flight change."""

    id: str
    step: str
    candidate_sha: str
    known_good_sha: str
    reason: str = ""
    pid: int = field(default_factory=os.getpid)
    started: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    history: list[str] = field(default_factory=list)


def _entry(data: object) -> JournalEntry:
    """A `JournalEntry` from parsed JSON; `TypeError`/`ValueError` for anything of another shape."""
    if not isinstance(data, dict):
        raise TypeError(f"the journal holds a {type(data).__name__}, not an object")
    entry = JournalEntry(**data)
    text_fields = (entry.id, entry.step, entry.candidate_sha, entry.known_good_sha, entry.reason)
    if not all(isinstance(v, str) for v in text_fields) or entry.step not in STEPS:
        raise ValueError(f"the journal's fields have the wrong types or an unknown step {entry.step!r}")
    if not isinstance(entry.history, list) or not all(isinstance(h, str) for h in entry.history):
        raise ValueError("the journal's history is not a list of steps")
    if not _finite(entry.pid, 0, 2**31) or not all(
        _finite(t, 0, 1e11) for t in (entry.started, entry.updated)
    ):
        raise ValueError("the journal's pid or times are not numbers in range")
    return entry


class Journal:
    """The journal, known-good and candidate files in `state_dir`."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / "journal.json"
        self.known_good_path = self.dir / "known-good.service"
        self.candidate_path = self.dir / "candidate.service"
        self.counters_path = self.dir / "counters.json"
        self.started_path = self.dir / "started.json"

    def read(self) -> JournalEntry | None:
        """The open entry, or None when nothing is in flight.

        A torn write cannot happen (atomic replace), so a journal that is not valid JSON or not the
        shape written here was damaged by something else: it still means "in flight" (the caller
        restores known-good), and a copy is kept beside it for a human to look at.
        """
        try:
            text = read_state(self.path)
            if text is None:
                return None
            return _entry(json.loads(text))
        except DamagedStateError as e:
            return self._unreadable(e.data, f"the journal {e.why}")
        except (ValueError, TypeError, RecursionError) as e:  # RecursionError: deeply nested JSON
            return self._unreadable(text.encode(), str(e)[:300] or type(e).__name__)

    def _unreadable(self, data: bytes, why: str) -> JournalEntry:
        """Keep the damaged journal as `journal.unreadable-<sha>.json` (a link, no copy) and put a small
        one in its place that still says "in flight", so the caller restores known-good."""
        entry = JournalEntry(id="unreadable", step="begin", candidate_sha="", known_good_sha="", reason=why)
        with contextlib.suppress(OSError):  # a courtesy; recovery must not depend on it
            aside = self.dir / f"journal.unreadable-{sha(data)}.json"
            if not aside.exists():
                os.link(self.path, aside)
            write_local_atomic(self.path, json.dumps(asdict(entry), indent=1) + "\n")
        return entry

    def _set_aside(self, path: Path, e: DamagedStateError) -> None:
        """Rename a damaged state file to `<name>.unreadable-<sha><suffix>`; it is then recreated."""
        with contextlib.suppress(OSError):
            os.replace(path, path.with_name(f"{path.stem}.unreadable-{sha(e.data)}{path.suffix}"))

    def _read_text(self, path: Path) -> str | None:
        try:
            return read_state(path)
        except DamagedStateError as e:
            self._set_aside(path, e)
            return None

    def open(self, *, candidate: str, known_good: str, reason: str = "") -> JournalEntry:
        """Record the texts, then open an entry at step `begin`."""
        save_state(self.candidate_path, candidate)
        save_state(self.known_good_path, known_good)
        entry = JournalEntry(
            id=time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}",
            step="begin",
            candidate_sha=sha(candidate),
            known_good_sha=sha(known_good),
            reason=reason,
        )
        self._write(entry)
        return entry

    def step(self, entry: JournalEntry, step: str) -> None:
        """Advance `entry` to `step`, durably, before the step is taken."""
        assert step in STEPS, step
        entry.history.append(entry.step)
        entry.step, entry.updated = step, time.time()
        self._write(entry)

    def _write(self, entry: JournalEntry) -> None:
        save_state(self.path, json.dumps(asdict(entry), indent=1) + "\n")
        if os.environ.get(FAULT_ENV) == entry.step:
            os.kill(os.getpid(), signal.SIGKILL)

    def close(self) -> None:
        """Remove the entry: nothing is in flight any more."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def known_good(self) -> str | None:
        """The last known-good unit text recorded here, if any (a damaged copy is set aside: none)."""
        return self._read_text(self.known_good_path)

    def candidate(self) -> str | None:
        """The in-flight candidate text, if any (a damaged copy is set aside: none)."""
        return self._read_text(self.candidate_path)

    def set_known_good(self, text: str) -> None:
        """Make `text` the known-good configuration."""
        save_state(self.known_good_path, text)

    # --- what optagent last started -------------------------------------------------------------

    def started(self) -> StartRecord | None:
        """The record of optagent's last restart of the service (a damaged one is set aside: none)."""
        text = self._read_text(self.started_path)
        try:
            data = json.loads(text) if text is not None else None
            return StartRecord(str(data["sha"]), str(data["process"])) if data else None
        except (ValueError, TypeError, KeyError, RecursionError) as e:
            self._set_aside(self.started_path, DamagedStateError(str(e), (text or "").encode()))
            return None

    def set_started(self, record: StartRecord | None) -> None:
        """Record (or, with None, forget) what optagent last started."""
        if record is None:
            self.started_path.unlink(missing_ok=True)
        else:
            save_state(self.started_path, json.dumps(asdict(record)) + "\n")

    # --- counters for the restart-rate limit and the consecutive-failure stop -----------------

    def counters(self) -> dict[str, Any]:
        """`{"restarts": [unix times], "failures": [unix times of consecutive failed candidates],
        "damaged": [unix times a damaged counters file was found]}`.

        A damaged file (not JSON, the wrong shape, numbers out of range) is set aside as
        `counters.unreadable-<sha>.json` and a new one records when: how many restarts it held is
        not known, so `limits.check_limits` counts the day's budget as spent, never as zero."""
        text, why = "", ""
        try:
            text = read_state(self.counters_path) or "{}"
            data = json.loads(text)
        except DamagedStateError as e:
            return self._counters_damaged(e)
        except (ValueError, RecursionError) as e:  # RecursionError: deeply nested JSON
            return self._counters_damaged(DamagedStateError(str(e)[:200], text.encode()))

        def times(key: str) -> list[float]:
            value = data.get(key, []) if isinstance(data, dict) else None
            return [float(t) for t in value if _finite(t, 0, 1e11)] if isinstance(value, list) else []

        out = {key: times(key) for key in ("restarts", "failures", "damaged")}
        if not isinstance(data, dict) or any(key in data and data[key] != out[key] for key in out):
            why = "has the wrong shape or numbers out of range"  # a huge integer, a negative time
            return self._counters_damaged(DamagedStateError(why, text.encode()))
        return out

    def _counters_damaged(self, e: DamagedStateError) -> dict[str, Any]:
        self._set_aside(self.counters_path, e)
        out: dict[str, Any] = {"restarts": [], "failures": [], "damaged": [time.time()]}
        with contextlib.suppress(OSError):  # recorded at once: the next command counts it too
            write_local_atomic(self.counters_path, json.dumps(out) + "\n")
        return out

    def record(self, *, restart: bool = False, failure: bool | None = None) -> None:
        """Count a restart; count a failed candidate (`failure=True`) or reset the count (`False`)."""
        data, now = self.counters(), time.time()
        if restart:  # a day of them, for the daily budget (bounded: the budget stops far below this)
            data["restarts"] = [t for t in data["restarts"] if now - t < DAY_S][-MAX_KEPT:] + [now]
        data["damaged"] = [t for t in data["damaged"] if now - t < DAY_S]
        if failure is True:
            data["failures"].append(now)
        elif failure is False:
            data["failures"] = []
        save_state(self.counters_path, json.dumps(data) + "\n")
