"""systemd unit files and shell launch scripts: parse, edit one flag, render byte-exact.

A `UnitFile` keeps the original text; every word of the server command knows its byte span, so an
edit splices only the bytes of the flag it changes and every other byte renders identically. Values
are quoted by code (systemd rules for units, POSIX shell rules for scripts) and every edit is
re-parsed and compared before it is returned, so no value can escape its argument.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from tools.deploy.units import edits
from tools.deploy.units import lex as unitlex
from tools.deploy.units.entry import refuse_shell_string
from tools.deploy.units.lex import UnitFileError, Word
from tools.deploy.units.tokens import (
    FlagSpan,
    Token,
    command_tokens,
    flags_start,
    looks_like_option,
    parse_flags,
)

__all__ = ["ServerCommand", "UnitFile", "UnitFileError", "unified_diff", "check_value", "check_flag"]

Kind = Literal["systemd", "script"]
FLAG_RE = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
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
    tokens: tuple[Token, ...] = ()
    """The arguments after the executable as the server gets them (`tools.deploy.units.tokens`)."""
    host_env: tuple[tuple[str, str], ...] = ()
    """Variables given to `parse` (the host's `EnvironmentFile=` values), which win over `Environment=`."""
    spans: tuple[FlagSpan, ...] = ()
    flags_from: int = 0
    """Index in `tokens` of the server's first own argument (after its entry point)."""

    @classmethod
    def parse(cls, text: str, *, kind: Kind | None = None, env: Mapping[str, str] | None = None) -> UnitFile:
        """Parse a systemd unit (`kind="systemd"`) or a shell launch script (`kind="script"`).

        With no `kind`, text starting with `#!` or without any `[Section]` line is a script. `env`:
        the variables of the unit's `EnvironmentFile=` files, read on the host; without it a `$NAME`
        that `Environment=` does not set is an argument whose words are unknown.
        """
        if "\0" in text:
            raise UnitFileError("the file contains a NUL byte")
        if kind is None:
            has_section = re.search(r"^\s*\[[^\]\n]+\]\s*$", text, re.M) is not None
            kind = "script" if text.startswith("#!") or not has_section else "systemd"
        host_env = dict(env or {})
        if kind == "systemd":
            entries = unitlex.parse_entries(text)
            cmd = unitlex.find_exec_start(entries)
            words, prefix = unitlex.systemd_words(cmd), cmd.prefix
            env_words = tuple(w for e in unitlex.environment_entries(entries) for w in unitlex.entry_words(e))
            first = 2 if "@" in prefix else 1
            multiline, indent = cmd.multiline, cmd.last_indent
            variables = {**dict(w.value.split("=", 1) for w in env_words), **host_env}
        else:
            entries = ()
            words, assigns, multiline, indent = unitlex.script_command(text)
            prefix, env_words, first, variables = "", tuple(assigns), 1, {}
        if not words or (kind == "systemd" and len(words) < first):
            raise UnitFileError("the server command is empty")
        refuse_shell_string(words, first)
        tokens = command_tokens(words, first, variables)
        start = flags_start(words[0].value, tokens)
        spans = parse_flags(tokens, start)
        return cls(text, kind, tuple(words), first, prefix, env_words, entries, multiline, indent,
                   tuple(tokens), tuple(sorted(host_env.items())), tuple(spans), start)  # fmt: skip

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
        """The server command with its flags in order (read from the arguments the server gets)."""
        return ServerCommand(
            executable=self.words[0].value,
            args=tuple(w.value for w in self.words[1:]),
            flags={s.name: s.value for s in self.spans},
            prefix=self.prefix,
            env=dict(w.value.split("=", 1) for w in self.env_words) if self.kind == "script" else {},
        )

    @property
    def environment(self) -> dict[str, str]:
        """`Environment=` variables (systemd) or leading assignments (script), in order."""
        return dict(w.value.split("=", 1) for w in self.env_words)

    @property
    def unknown_words(self) -> list[str]:
        """The server's arguments whose words are not known here: a `$NAME` no `Environment=` (or
        `env`) sets, after the entry point (a wrapper's are not the server's)."""
        return [t.value for t in self.tokens[self.flags_from :] if t.opaque and t.var is not None]

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

    # --- edits (planned by `tools.deploy.units.edits`, checked here) ---------------------------

    def set_flag(self, flag: str, value: str | Sequence[str] | None = None) -> UnitFile:
        """Set `flag` (a boolean flag when `value` is None), replacing it in place if present: in the
        `ExecStart=` words, or inside the `Environment=` value of the `$NAME` it is written in."""
        check_flag(flag)
        values = [value] if isinstance(value, str) else list(value or [])
        for v in values:
            check_value(flag, v)
        if (value is not None and not isinstance(value, str)) and (
            not values or any(looks_like_option(v) or v == "" for v in values)
        ):
            raise UnitFileError(f"values for {flag} must be non-empty and must not start with '-'")
        expected = self.command.flags
        expected[flag] = value if value is None or isinstance(value, str) else " ".join(value)
        text, changed = edits.set_flag(self, flag, value)
        return self._checked(text, expected, changed)

    def unset_flag(self, flag: str) -> UnitFile:
        """Remove every occurrence of `flag` (and its values); removing an absent flag is an error."""
        check_flag(flag)
        if flag not in self.command.flags:
            raise UnitFileError(f"{flag} is not set in the server command")
        expected = self.command.flags
        del expected[flag]
        text, changed = edits.unset_flag(self, flag)
        return self._checked(text, expected, changed)

    def _checked(self, text: str, expected: dict[str, str | None], changed: set[str]) -> UnitFile:
        """The edited file, re-parsed: its flags must be `expected`, and every other argument, the
        executable and every variable but those in `changed` exactly as before."""
        try:
            new = UnitFile.parse(text, kind=self.kind, env=dict(self.host_env))
        except UnitFileError as e:
            raise UnitFileError(f"the edit would produce an invalid file: {e}") from e
        if new.command.flags != expected or list(new.command.flags) != list(expected):
            raise UnitFileError(
                "the edit did not round-trip; refusing it (a value would escape its argument)"
            )
        before = {k: v for k, v in self.environment.items() if k not in changed}
        after = {k: v for k, v in new.environment.items() if k not in changed}
        if before != after or new.command.executable != self.command.executable:
            raise UnitFileError("the edit changed the environment or the executable; refusing it")
        if _other_arguments(new) != _other_arguments(self):
            raise UnitFileError(
                "the edit would move or drop an argument it did not mean to touch; refusing it"
            )
        return new

    def with_text(self, text: str) -> UnitFile:
        """Parse `text` as the same kind of file (with the same `env`)."""
        return replace(self, text=text).parse(text, kind=self.kind, env=dict(self.host_env))


def _other_arguments(unit: UnitFile) -> list[tuple[str, bool]]:
    """The arguments that belong to no flag (wrappers, entry point, variables not known), in order."""
    covered = {i for s in unit.spans for i in s.indexes}
    return [(t.value, t.opaque) for i, t in enumerate(unit.tokens) if i not in covered]


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
