"""Secrets out of terminal output: unit texts, diffs, status and server logs hold the API key.

A unit file that starts SGLang with `--api-key KEY` (or `Environment=HF_TOKEN=...`) would print it
in `optagent deploy`'s diff, in `optagent status` and in the log lines of a failed start. The
values of secret-named flags, variables and server arguments, and the configured key itself, are
replaced wherever they appear.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["REDACTED", "is_secret_name", "redact_flags", "redact_text"]

REDACTED = "[REDACTED]"
_NAME = r"[A-Za-z0-9_-]*(?:api[-_]?key|token|password|passwd|secret|credential)[A-Za-z0-9_-]*"
_SECRET_NAME = re.compile(rf"(?i)^-*{_NAME}$")
_PATTERNS = [
    # --api-key KEY, --api-key=KEY, --hf-token "KEY" (also inside a diff line)
    re.compile(rf"(?i)(--{_NAME})(=|[ \t]+)(\"[^\"]*\"|'[^']*'|[^\s\\]+)"),
    # KEY=VALUE in Environment= lines and env files: HF_TOKEN=..., OPENAI_API_KEY="..."
    re.compile(rf"(?i)(\b{_NAME})(=)(\"[^\"]*\"|'[^']*'|[^\s\"']+)"),
    # a server's own dump of its arguments: api_key='KEY', "api_key": "KEY"
    re.compile(rf"(?i)(\b{_NAME}['\"]?)(\s*[:=]\s*)('[^']*'|\"[^\"]*\")"),
]


def is_secret_name(name: str) -> bool:
    """True for a flag or variable named like a secret (`--api-key`, `HF_TOKEN`, `admin_password`)."""
    return bool(_SECRET_NAME.match(name))


def _configured(extra: Iterable[str | None]) -> list[str]:
    values = {v for v in (*extra, os.environ.get("OPTAGENT_API_KEY")) if v and len(v) >= 4}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, *, secrets: Iterable[str | None] = ()) -> str:
    """`text` with secret-named values and the given secret values (and `$OPTAGENT_API_KEY`) replaced."""
    for value in _configured(secrets):
        text = text.replace(value, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(_hide, text)
    return text


def _hide(m: re.Match[str]) -> str:
    value = m.group(3)
    quote = value[0] if value[:1] in ("'", '"') else ""  # kept: JSON and shell words stay well-formed
    return f"{m.group(1)}{m.group(2)}{quote}{REDACTED}{quote}"


def redact_flags(flags: Mapping[str, str | None], *, secrets: Iterable[str | None] = ()) -> dict[str, Any]:
    """A unit's `--flag: value` mapping with the values of secret-named flags replaced."""
    keys = _configured(secrets)
    out: dict[str, Any] = {}
    for flag, value in flags.items():
        if value is not None and (is_secret_name(flag) or any(k in value for k in keys)):
            value = REDACTED
        out[flag] = value
    return out
