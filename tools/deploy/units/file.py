"""systemd unit files and shell launch scripts: parse, edit one flag, render byte-exact.

A `UnitFile` keeps the original text; every word of the server command knows its byte span, so an
edit splices only the bytes of the flag it changes and every other byte renders identically. Values
are quoted by code (systemd rules for units, POSIX shell rules for scripts) and every edit is
re-parsed and compared before it is returned, so no value can escape its argument.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from tools.deploy.units import lex as unitlex
from tools.deploy.units.entry import entry_point_end, refuse_shell_string
from tools.deploy.units.lex import UnitFileError, Word

__all__ = ["ServerCommand", "UnitFile", "UnitFileError", "unified_diff", "check_value", "check_flag"]

Kind = Literal["systemd", "script"]
FLAG_RE = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_NEGATIVE_NUMBER = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?\Z")
_SYSTEMD_SAFE = re.compile(r"[A-Za-z0-9_@+=:,./-]+\Z")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def check_flag(flag: str) -> None:
    """Raise `UnitFileError` unless `flag` is a plain `--name`."""
    if not FLAG_RE.match(flag):
        raise UnitFileError(
            f"not a valid flag name: {flag!r} (expected --name with letters, digits, -, _ or .)"
        )


def check_value(flag: str, value: str) -> None:
    """Raise `UnitFileError` for a value that no quoting can keep on one line of a unit file."""
    for ch, what in (("\n", "a newline"), ("\r", "a carriage return"), ("\0", "a NUL byte")):
        if ch in value:
            raise UnitFileError(f"value for {flag} contains {what}; it would start a new key or command")
    bad = [c for c in value if ord(c) < 32 or ord(c) == 127]
    if bad:
        raise UnitFileError(f"value for {flag} contains control character {bad[0]!r}")


def _looks_like_option(value: str) -> bool:
    return value.startswith("-") and value != "-" and not _NEGATIVE_NUMBER.match(value)


@dataclass(frozen=True)
class _FlagSpan:
    name: str
    name_index: int
    value_indexes: tuple[int, ...]
    eq_form: bool
    value: str | None


@dataclass(frozen=True)
class ServerCommand:
    """The launch command: `executable`, its `args` (unquoted) and the `--flags` in order."""

    executable: str
    args: tuple[str, ...]
    flags: dict[str, str | None]
    prefix: str = ""
    """systemd's `-@:+!` executable prefixes, as written."""
    env: dict[str, str] = field(default_factory=dict)
    """`NAME=value` assignments before the command (scripts only)."""

    @property
    def argv(self) -> list[str]:
        """Executable and arguments as one list."""
        return [self.executable, *self.args]


def _parse_flags(words: Sequence[Word], first: int) -> list[_FlagSpan]:
    spans: list[_FlagSpan] = []
    k = first
    while k < len(words):
        text = words[k].value
        if text.startswith("--") and len(text) > 2:
            if "=" in text:
                name, value = text.split("=", 1)
                spans.append(_FlagSpan(name, k, (), True, value))
                k += 1
                continue
            j = k + 1
            while j < len(words) and not _looks_like_option(words[j].value):
                j += 1
            indexes = tuple(range(k + 1, j))
            value = " ".join(words[i].value for i in indexes) if indexes else None
            spans.append(_FlagSpan(text, k, indexes, False, value))
            k = j
        else:
            k += 1
    return spans


@dataclass(frozen=True)
class UnitFile:
    """A parsed unit file or launch script; immutable, edits return a new `UnitFile`."""

    text: str
    kind: Kind
    words: tuple[Word, ...]
    first_arg: int
    """Index in `words` of the first argument after the executable (and systemd's argv[0])."""
    prefix: str
    env_words: tuple[Word, ...]
    entries: tuple[unitlex.Entry, ...] = ()
    multiline: bool = False
    indent: str = ""
    _spans: tuple[_FlagSpan, ...] = ()

    @classmethod
    def parse(cls, text: str, *, kind: Kind | None = None) -> UnitFile:
        """Parse a systemd unit (`kind="systemd"`) or a shell launch script (`kind="script"`).

        With no `kind`, text starting with `#!` or without any `[Section]` line is a script.
        """
        if "\0" in text:
            raise UnitFileError("the file contains a NUL byte")
        if kind is None:
            has_section = re.search(r"^\s*\[[^\]\n]+\]\s*$", text, re.M) is not None
            kind = "script" if text.startswith("#!") or not has_section else "systemd"
        if kind == "systemd":
            entries = unitlex.parse_entries(text)
            cmd = unitlex.find_exec_start(entries)
            words, prefix = unitlex.systemd_words(cmd), cmd.prefix
            env_words = tuple(w for e in unitlex.environment_entries(entries) for w in unitlex.entry_words(e))
            first = 2 if "@" in prefix else 1
            multiline, indent = cmd.multiline, cmd.last_indent
        else:
            entries = ()
            words, assigns, multiline, indent = unitlex.script_command(text)
            prefix, env_words, first = "", tuple(assigns), 1
        if not words or (kind == "systemd" and len(words) < first):
            raise UnitFileError("the server command is empty")
        refuse_shell_string(words, first)
        spans = tuple(_parse_flags(words, max(first, entry_point_end(words))))
        return cls(text, kind, tuple(words), first, prefix, env_words, entries, multiline, indent, spans)

    @classmethod
    def load(cls, path: str | Path) -> UnitFile:
        """Read and parse a file; a `.sh` file is a launch script."""
        path = Path(path)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise UnitFileError(f"{path}: cannot read: {e}") from e
        try:
            return cls.parse(text, kind="script" if path.suffix == ".sh" else None)
        except UnitFileError as e:
            raise UnitFileError(f"{path}: {e}") from e

    def render(self) -> str:
        """The file's text (byte-identical to what was parsed, plus any edits)."""
        return self.text

    @property
    def command(self) -> ServerCommand:
        """The server command with its flags in order."""
        return ServerCommand(
            executable=self.words[0].value,
            args=tuple(w.value for w in self.words[1:]),
            flags={s.name: s.value for s in self._spans},
            prefix=self.prefix,
            env=dict(w.value.split("=", 1) for w in self.env_words) if self.kind == "script" else {},
        )

    @property
    def environment(self) -> dict[str, str]:
        """`Environment=` variables (systemd) or leading assignments (script), in order."""
        return dict(w.value.split("=", 1) for w in self.env_words)

    @property
    def working_directory(self) -> str | None:
        """`WorkingDirectory=` of the service, without systemd's `-` prefix."""
        found = [e.value for e in self.entries if e.section == "Service" and e.key == "WorkingDirectory"]
        return found[-1].lstrip("-") or None if found else None

    def exec_argv(self, env: Mapping[str, str] | None = None) -> list[str]:
        """The argv to execute, with systemd `$VAR`/`${VAR}` references expanded from `env`."""
        env = {**self.environment, **(env or {})}
        argv = unitlex.expand(self.words[0], env)
        for w in self.words[self.first_arg :]:
            argv.extend(unitlex.expand(w, env))
        return argv

    # --- edits -------------------------------------------------------------------------------

    def _quote(self, value: str) -> str:
        if self.kind == "script":
            return shlex.quote(value)
        if _SYSTEMD_SAFE.match(value):
            return value
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%")
        return f'"{escaped}"'

    def _tokens(self, flag: str, value: str | Sequence[str] | None, *, eq_form: bool) -> str:
        if value is None:
            return self._quote(flag)
        if isinstance(value, str):
            if eq_form or value == "" or _looks_like_option(value):
                return self._quote(f"{flag}={value}")
            return f"{self._quote(flag)} {self._quote(value)}"
        return " ".join([self._quote(flag), *(self._quote(v) for v in value)])

    def set_flag(self, flag: str, value: str | Sequence[str] | None = None) -> UnitFile:
        """Set `flag` (a boolean flag when `value` is None), replacing it in place if present."""
        check_flag(flag)
        values = [value] if isinstance(value, str) else list(value or [])
        for v in values:
            check_value(flag, v)
        if (value is not None and not isinstance(value, str)) and (
            not values or any(_looks_like_option(v) or v == "" for v in values)
        ):
            raise UnitFileError(f"values for {flag} must be non-empty and must not start with '-'")
        expected = self.command.flags
        shown = value if value is None or isinstance(value, str) else " ".join(value)
        expected[flag] = shown
        old = [s for s in self._spans if s.name == flag]
        if not old:
            text = self._insert(self._tokens(flag, value, eq_form=False))
        else:
            # Later repeats go first: cutting them leaves the byte offsets of the first one valid.
            first, rest = old[0], old[1:]
            text = self._replace_flag(self._cut(self.text, rest), first, value)
        return self._checked(text, expected)

    def unset_flag(self, flag: str) -> UnitFile:
        """Remove every occurrence of `flag` (and its values); removing an absent flag is an error."""
        check_flag(flag)
        spans = [s for s in self._spans if s.name == flag]
        if not spans:
            raise UnitFileError(f"{flag} is not set in the server command")
        expected = self.command.flags
        del expected[flag]
        return self._checked(self._cut(self.text, spans), expected)

    def _span_end(self, s: _FlagSpan) -> int:
        return self.words[s.value_indexes[-1] if s.value_indexes else s.name_index].end

    def _replace_flag(self, text: str, s: _FlagSpan, value: str | Sequence[str] | None) -> str:
        simple = isinstance(value, str) and value != "" and not _looks_like_option(value)
        if not s.eq_form and len(s.value_indexes) == 1 and simple:
            w = self.words[s.value_indexes[0]]  # only the value's bytes change
            return text[: w.start] + self._quote(value) + text[w.end :]
        start = self.words[s.name_index].start
        new = self._tokens(s.name, value, eq_form=s.eq_form and isinstance(value, str))
        return text[:start] + new + text[self._span_end(s) :]

    def _cut(self, text: str, spans: Sequence[_FlagSpan]) -> str:
        # Remove from the end of the previous word so a flag on its own continuation line goes whole.
        for s in sorted(spans, key=lambda s: s.name_index, reverse=True):
            start, end = self.words[s.name_index].start, self._span_end(s)
            line_start = text.rfind("\n", 0, start) + 1
            tail = re.match(r"[ \t]*\\\r?\n", text[end:])
            if text[line_start:start].strip() == "" and tail:
                start, end = line_start, end + tail.end()  # the flag has its own continuation line
            else:
                start = self.words[s.name_index - 1].end
            text = text[:start] + text[end:]
        return text

    def _insert(self, tokens: str) -> str:
        at = self.words[-1].end
        sep = f" \\\n{self.indent}" if self.multiline else " "
        return self.text[:at] + sep + tokens + self.text[at:]

    def _checked(self, text: str, expected: dict[str, str | None]) -> UnitFile:
        try:
            new = UnitFile.parse(text, kind=self.kind)
        except UnitFileError as e:
            raise UnitFileError(f"the edit would produce an invalid file: {e}") from e
        if new.command.flags != expected or list(new.command.flags) != list(expected):
            raise UnitFileError(
                "the edit did not round-trip; refusing it (a value would escape its argument)"
            )
        if new.environment != self.environment or new.command.executable != self.command.executable:
            raise UnitFileError("the edit changed the environment or the executable; refusing it")
        return new

    def with_text(self, text: str) -> UnitFile:
        """Parse `text` as the same kind of file."""
        return replace(self, text=text).parse(text, kind=self.kind)


def unified_diff(old: str, new: str, *, name: str = "sglang.service") -> str:
    """A unified diff of two versions of a file, for display."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=f"a/{name}", tofile=f"b/{name}"
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def is_assignment(text: str) -> bool:
    """True for a shell `NAME=value` word."""
    return _ASSIGNMENT.match(text) is not None
