"""Session transcripts: one append-only JSONL file per session, written after every step.

The format (version 1) is the contract in `agent/README.md`: a `header` record, then `message`,
`event` and `end` records. Message numbers are global to the session and shared by the planner and
its subagents; a subagent message carries `parent`, the planner message that spawned it. Parts are
pydantic-ai message parts dumped as JSON so that a session can be resumed. Writing never raises: a
failed write warns once and the run goes on. Secrets are redacted before anything reaches the disk
(`tools.redact`).

pydantic-ai is imported only where messages are converted, so reading transcripts stays fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import threading
import warnings
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.transcripts.load import FORMAT_VERSION, SUFFIX, load_transcript
from tools.localfiles import open_append, write_bytes
from tools.redact import redact


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _jsonable(value: Any) -> Any:
    """Turn pydantic models, dataclasses, paths and datetimes into plain JSON values."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def message_role(message: dict[str, Any]) -> str:
    """`assistant` for a model response; `tool`, `user` or `system` for a request by its parts."""
    if message.get("kind") == "response":
        return "assistant"
    kinds = {p.get("part_kind") for p in message.get("parts", [])}
    if kinds & {"tool-return", "retry-prompt", "builtin-tool-return"}:
        return "tool"
    if "user-prompt" in kinds:
        return "user"
    return "system" if "system-prompt" in kinds else "user"


def _dump_messages(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """pydantic-ai messages (or their already-dumped dicts) as JSON dicts."""
    items = list(messages)
    if all(isinstance(m, dict) for m in items):
        return [dict(m) for m in items]
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    return [
        m if isinstance(m, dict) else ModelMessagesTypeAdapter.dump_python([m], mode="json")[0] for m in items
    ]


def new_id(kind: str) -> str:
    """A sortable, readable session id: `20250131-142501-run-3fa2`."""
    return f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{kind}-{secrets.token_hex(2)}"


class Transcript:
    """Append-only writer of one session's transcript; every write is flushed, none ever raises."""

    def __init__(self, path: Path, header: dict[str, Any], *, next_msg: int = 1) -> None:
        self.path = Path(path)
        self.header = header
        self.id: str = header.get("id", self.path.stem)
        self.next_msg = next_msg
        self.closed = False
        self._warned = False
        self._lock = threading.Lock()
        self._file: Any = None

    @classmethod
    def create(
        cls,
        directory: Path | str,
        *,
        kind: str,
        goal: str,
        model: str,
        target: str,
        config: Any = None,
    ) -> Transcript:
        """Start a new transcript `<directory>/<id>.jsonl` and write its header."""
        sid = new_id(kind)
        header = {
            "type": "header",
            "format": FORMAT_VERSION,
            "id": sid,
            "kind": kind,
            "started_at": _now(),
            "goal": goal,
            "model": model,
            "target": target,
            "config": _jsonable(config) if config is not None else {},
        }
        t = cls(Path(directory) / f"{sid}{SUFFIX}", header)
        t._write(header)
        return t

    @classmethod
    def resume(cls, path: Path | str) -> Transcript:
        """Continue an existing transcript: numbering goes on after its last message.

        A damaged tail (a line cut by a crash) is dropped first; the original file is kept as
        `<name>.bak` so nothing is lost. Raises `FileNotFoundError` or `ValueError` (no header).
        """
        path = Path(path)
        loaded = load_transcript(path)
        if loaded.header is None:
            raise ValueError(f"{path}: not a transcript ({loaded.error or 'no header'})")
        if loaded.error is not None and loaded.good_bytes is not None:
            write_bytes(path.with_name(path.name + ".bak"), path.read_bytes())
            with open_append(path) as f:
                f.truncate(loaded.good_bytes)
        last = max((m["msg"] for m in loaded.messages), default=0)
        t = cls(path, loaded.header, next_msg=last + 1)
        t.event("note", {"resumed": True, "previous_end": loaded.end})
        return t

    @property
    def failed(self) -> bool:
        """True once a write has failed (later writes are still attempted)."""
        return self._warned

    def add_messages(
        self, messages: Iterable[Any], *, agent: str = "planner", parent: int | None = None
    ) -> list[int]:
        """Append pydantic-ai messages (as from `result.new_messages()`); returns their msg numbers."""
        try:
            dumped = _dump_messages(messages)
        except Exception as e:  # a transcript must never break the run
            self._warn(f"could not serialize messages: {e}")
            return []
        numbers = []
        with self._lock:
            for m in dumped:
                n = self.next_msg
                self.next_msg += 1
                numbers.append(n)
                extra = {k: v for k, v in m.items() if k not in ("parts", "usage")}
                self._write(
                    {
                        "type": "message",
                        "msg": n,
                        "agent": agent,
                        "parent": parent,
                        "role": message_role(m),
                        "ts": _now(),
                        "parts": m.get("parts", []),
                        "usage": m.get("usage"),
                        "message": extra,
                    }
                )
        return numbers

    def event(self, kind: str, data: Any, *, msg: int | None = None) -> None:
        """Record a structured event (todo list, verdict, trial, deploy, approval, ...)."""
        self._write({"type": "event", "kind": kind, "msg": msg, "ts": _now(), "data": _jsonable(data)})

    def close(self, outcome: Any) -> None:
        """Write the `end` record with the outcome (`kept`, `gain`, `status`, ...)."""
        self._write({"type": "end", "ts": _now(), "outcome": _jsonable(outcome)})
        self.closed = True
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def discard(self) -> None:
        """Remove the transcript of a session that never started (its target was locked): kept, an
        empty transcript would become `last` and hide the session the user wants to read."""
        self.closed = True
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)

    def _write(self, record: dict[str, Any]) -> None:
        try:
            line = json.dumps(redact(record), ensure_ascii=False, default=str)
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open_append(self.path)
            self._file.write(line + "\n")
            self._file.flush()
        except Exception as e:  # disk full, permissions, unserializable data: warn, never crash
            self._warn(f"could not write transcript {self.path}: {e}")

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(message, RuntimeWarning, stacklevel=3)
