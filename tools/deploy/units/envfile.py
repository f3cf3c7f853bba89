"""systemd `EnvironmentFile=`: which files a unit names, and the `KEY=VALUE` lines inside them.

The process manager starts `ExecStart` itself, so it must give the server the same variables systemd
would: files are read through the transport (they live on the host), in order, and override
`Environment=` (systemd's rule). A `-` prefix makes a missing file harmless.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tools.deploy.units.lex import Entry, UnitFileError

__all__ = ["EnvFileRef", "environment_files", "parse_env_file"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class EnvFileRef:
    """One `EnvironmentFile=` path; `optional` when written with systemd's `-` prefix."""

    path: str
    optional: bool


def environment_files(entries: Sequence[Entry]) -> list[EnvFileRef]:
    """The service's `EnvironmentFile=` entries in order, honoring empty resets."""
    found: list[EnvFileRef] = []
    for e in entries:
        if e.section != "Service" or e.key != "EnvironmentFile":
            continue
        value = e.value.strip()
        if not value:
            found = []
            continue
        optional = value.startswith("-")
        path = value[1:] if optional else value
        if not path.startswith("/"):
            raise UnitFileError(f"line {e.line}: EnvironmentFile= needs an absolute path, got {path!r}")
        if "%" in path:
            raise UnitFileError(f"line {e.line}: EnvironmentFile= specifiers (%) are not supported: {path!r}")
        found.append(EnvFileRef(path, optional))
    return found


def _unquote(value: str, where: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        inner = value[1:-1]
        return re.sub(r"\\(.)", r"\1", inner) if value[0] == '"' else inner
    if value[:1] in "\"'":
        raise UnitFileError(f"{where}: unterminated quote")
    return value


def parse_env_file(text: str, *, name: str = "environment file") -> dict[str, str]:
    """`KEY=VALUE` lines (comments `#`/`;`, blank lines, quotes, `\\` continuations) as a dict."""
    env: dict[str, str] = {}
    lines = text.replace("\\\n", "").splitlines()  # a trailing backslash joins the next line
    for no, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, eq, value = line.partition("=")
        key = key.strip()
        if not eq or not _NAME.match(key):
            raise UnitFileError(f"{name} line {no}: {raw.strip()!r} is not KEY=VALUE")
        env[key] = _unquote(value.strip(), f"{name} line {no}")
    return env
