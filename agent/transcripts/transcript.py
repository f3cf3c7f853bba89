"""Session transcripts: one append-only JSONL file per session, written after every step.

The format (version 1) is the contract in `agent/README.md`: a `header` record, then `message`,
`event` and `end` records. Message numbers are global to the session and shared by the planner and
its subagents; a subagent message carries `parent`, the planner message that spawned it. Parts are
pydantic-ai message parts dumped as JSON so that a session can be resumed. Writing never raises: a
failed write warns once and the run goes on. Secrets are redacted before anything reaches the disk.

pydantic-ai is imported only where messages are converted, so reading transcripts stays fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import shutil
import threading
import warnings
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
SUFFIX = ".jsonl"
REDACTED = "[REDACTED]"

_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_SECRET_KEY = re.compile(
    r"(?i)^(.*api[_-]?key|.*secret.*|.*password|passwd|.*access[_-]?token|.*auth[_-]?token|token|authorization)$"
)
# A name ending in a secret word (api_key, admin-api-key, ssl_keyfile_password, hf_token), never a
# counter such as max_tokens or input_tokens; a value quoted or bare (a bare one stops at & for URLs).
_SECRET_NAME = r"[\w-]*(?:api[_-]?key|password|passwd|token|secret)"
_SECRET_VALUE = r"(?:\"[^\"]*\"|'[^']*'|[^\s\"',;)&]+)"
_SECRET_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(?i)(authorization\s*[:=]\s*)(bearer|basic|token)\s+[^\s\"',]+"), rf"\1\2 {REDACTED}"),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {REDACTED}"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"), f"sk-{REDACTED}"),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), f"hf_{REDACTED}"),
    (re.compile(rf"(?i)(--{_SECRET_NAME}(?:=|\s+))(?!--|(?:None|null)\b){_SECRET_VALUE}"), rf"\1{REDACTED}"),
    (
        re.compile(rf"(?i)((?<![\w-]){_SECRET_NAME}[\"']?\s*[=:]\s*)(?!(?:None|null)\b){_SECRET_VALUE}"),
        rf"\1{REDACTED}",
    ),
    (re.compile(r"(?i)([?&](?:key|sig|signature|auth)=)[^\s&#\"']+"), rf"\1{REDACTED}"),
    (
        re.compile(r"\b([A-Z0-9_]*(?:API_?KEY|TOKEN(?!S)|SECRET|PASSWORD)[A-Z0-9_]*\s*[=:]\s*)([^\s\"',;]+)"),
        rf"\1{REDACTED}",
    ),
    (re.compile(r"([a-z][a-z0-9+.-]*://[^/\s:@]+:)[^@\s/]+@"), rf"\1{REDACTED}@"),
]


class TranscriptNotFound(LookupError):
    """No transcript (or more than one) matches the given id or prefix."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _env_secrets() -> list[str]:
    """Values of environment variables whose names say they are secrets (long enough to be real)."""
    values = {v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= 6}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, *, extra: Iterable[str] = ()) -> str:
    """`text` with API keys, bearer tokens, URL passwords and the given secret values replaced."""
    for value in extra:
        if value and value in text:
            text = text.replace(value, REDACTED)
    for pattern, repl in _SECRET_PATTERNS:
        text = pattern.sub(repl, text)
    return text


def redact(value: Any, *, extra: Iterable[str] = ()) -> Any:
    """A JSON-like value with every secret-looking string redacted (keys named like secrets too)."""
    extra = list(extra)
    if isinstance(value, str):
        return redact_text(value, extra=extra)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(v, str) and isinstance(k, str) and _SECRET_KEY.match(k) and v:
                out[k] = REDACTED
            else:
                out[k] = redact(v, extra=extra)
        return out
    if isinstance(value, list | tuple):
        return [redact(v, extra=extra) for v in value]
    return value


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
        self._secrets = _env_secrets()
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
            shutil.copyfile(path, path.with_name(path.name + ".bak"))
            with path.open("r+b") as f:
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

    def _write(self, record: dict[str, Any]) -> None:
        try:
            line = json.dumps(redact(record, extra=self._secrets), ensure_ascii=False, default=str)
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8")
            self._file.write(line + "\n")
            self._file.flush()
        except Exception as e:  # disk full, permissions, unserializable data: warn, never crash
            self._warn(f"could not write transcript {self.path}: {e}")

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(message, RuntimeWarning, stacklevel=3)


@dataclasses.dataclass
class LoadedTranscript:
    """A transcript read back; `error` names the first line that failed (everything before is kept)."""

    path: Path
    header: dict[str, Any] | None
    messages: list[dict[str, Any]]
    events: list[dict[str, Any]]
    end: dict[str, Any] | None
    error: str | None = None
    error_line: int | None = None
    good_bytes: int | None = None
    """Byte offset where the first bad line starts (None when the file is whole)."""

    @property
    def id(self) -> str:
        return (self.header or {}).get("id", self.path.stem)

    def model_messages(self, *, agent: str = "planner") -> list[Any]:
        """The messages of one agent as pydantic-ai `ModelMessage`s, to continue the conversation."""
        from pydantic_ai.messages import ModelMessagesTypeAdapter

        raw = []
        for m in self.messages:
            if m.get("agent") != agent:
                continue
            d = dict(m.get("message") or {})
            d.setdefault("kind", "response" if m.get("role") == "assistant" else "request")
            d["parts"] = m.get("parts", [])
            if d["kind"] == "response" and m.get("usage"):
                d["usage"] = m["usage"]
            raw.append(d)
        return ModelMessagesTypeAdapter.validate_python(raw)

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        """The events of one kind, in order."""
        return [e for e in self.events if e.get("kind") == kind]


def _migrate_v0(record: dict[str, Any]) -> dict[str, Any]:
    """Format 0 (the pre-release draft): `n` for `msg`, a plain `text` instead of `parts`, `events`
    named by `event`; the header had no `format` key and an `created` timestamp."""
    rtype = record.get("type")
    if rtype == "header":
        record = {**record, "format": FORMAT_VERSION, "started_at": record.get("created", "")}
        record.setdefault("kind", "run")
    elif rtype == "message":
        role = record.get("role", "user")
        part_kind = {"assistant": "text", "system": "system-prompt"}.get(role, "user-prompt")
        record = {
            "type": "message",
            "msg": record.get("n"),
            "agent": record.get("agent", "planner"),
            "parent": record.get("parent"),
            "role": role,
            "ts": record.get("ts", ""),
            "parts": [{"part_kind": part_kind, "content": record.get("text", "")}],
            "usage": None,
            "message": {"kind": "response" if role == "assistant" else "request"},
        }
    elif rtype == "event" and "kind" not in record:
        record = {**record, "kind": record.get("event", "note")}
    return record


_MIGRATIONS = {0: _migrate_v0}


def load_transcript(path: Path | str) -> LoadedTranscript:
    """Read a transcript of any known format version; stops at the first unreadable line."""
    path = Path(path)
    out = LoadedTranscript(path=path, header=None, messages=[], events=[], end=None)
    version = FORMAT_VERSION
    offset = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                continue
            problem = None
            try:
                record = json.loads(text)
                if not isinstance(record, dict) or "type" not in record:
                    problem = "not a transcript record"
            except json.JSONDecodeError as e:
                problem = "truncated line" if not raw.endswith(b"\n") else f"invalid JSON ({e.msg})"
            if problem is None and out.header is None and record["type"] != "header":
                problem = "the first record is not a header"
            if problem is None and record["type"] == "header" and out.header is None:
                version = int(record.get("format", 0))
            if problem is None and version in _MIGRATIONS:
                record = _MIGRATIONS[version](record)
            if problem is None and record["type"] == "message" and not isinstance(record.get("msg"), int):
                problem = "message without a number"
            if problem is not None:
                out.error = f"{path.name}: line {lineno}: {problem}"
                out.error_line = lineno
                out.good_bytes = start
                break
            rtype = record["type"]
            if rtype == "header" and out.header is None:
                out.header = record
            elif rtype == "message":
                out.messages.append(record)
            elif rtype == "event":
                out.events.append(record)
            elif rtype == "end":
                out.end = record
    return out


def list_transcripts(directory: Path | str) -> list[Path]:
    """Transcript files in `directory`, oldest first (ids sort by start time)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(directory.glob(f"*{SUFFIX}"), key=lambda p: (p.stem, p.stat().st_mtime))


def find_transcript(id_or_prefix: str, directory: Path | str) -> Path:
    """The transcript named by an id, a unique prefix of one, `last`, or a path to a file."""
    as_path = Path(id_or_prefix)
    if as_path.suffix == SUFFIX and as_path.is_file():
        return as_path
    paths = list_transcripts(directory)
    if id_or_prefix in ("last", "latest") and paths:
        return max(paths, key=lambda p: p.stat().st_mtime)
    exact = [p for p in paths if p.stem == id_or_prefix]
    if exact:
        return exact[0]
    matches = [p for p in paths if p.stem.startswith(id_or_prefix)] if id_or_prefix else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise TranscriptNotFound(f"no transcript {id_or_prefix!r} in {directory}")
    names = ", ".join(p.stem for p in matches[:5])
    raise TranscriptNotFound(f"{id_or_prefix!r} matches {len(matches)} transcripts: {names}")
