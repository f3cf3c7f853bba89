"""Reading transcripts: `load_transcript` reads a file of any known format version (older ones are
migrated record by record) and stops at the first unreadable line, saying where; `list_transcripts`
and `find_transcript` find them by id, prefix or `last`. Moved from `transcript.py` (the writer)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
SUFFIX = ".jsonl"


class TranscriptNotFound(LookupError):
    """No transcript (or more than one) matches the given id or prefix."""


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
