"""Secrets out of transcripts: API keys, bearer tokens, URL passwords, secret-named keys and flags,
and the values of secret-named environment variables are replaced before anything reaches the disk
(`agent.transcripts.transcript` calls `redact` on every record). Moved from `transcript.py`."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

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


def env_secrets() -> list[str]:
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
