"""The server's API key: SGLang started with `--api-key` answers 401 to every API request without it.

The key comes from `target.api_key` in optagent.toml or, better (a config file is easy to share), from
the `OPTAGENT_API_KEY` environment variable. It is sent as `Authorization: Bearer KEY` on every request
to the server; transcripts redact it (it lives in an environment variable named like a secret).
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["API_KEY_ENV", "api_key", "auth_headers", "export_api_key", "scrub_server_info"]

API_KEY_ENV = "OPTAGENT_API_KEY"


def api_key(configured: str | None = None) -> str | None:
    """`configured`, else `$OPTAGENT_API_KEY`, else None (an empty value means none)."""
    return configured or os.environ.get(API_KEY_ENV) or None


def auth_headers(configured: str | None = None) -> dict[str, str]:
    """`{"Authorization": "Bearer KEY"}` when a key is known, else `{}`."""
    key = api_key(configured)
    return {"Authorization": f"Bearer {key}"} if key else {}


def export_api_key(configured: str | None) -> None:
    """Make a key from the config file visible to every request this process makes (and to the
    transcript's redaction, which hides the values of secret-named environment variables)."""
    if configured and not os.environ.get(API_KEY_ENV):
        os.environ[API_KEY_ENV] = configured


_SECRET_KEY = re.compile(r"(?i)(api_key|password|passwd|secret|credential)$|^(hf|auth|access)_token$")


def scrub_server_info(info: Any) -> Any:
    """`info` (a server's args, nested anywhere) with secret-named values replaced, so a saved
    benchmark or context never carries the key the server was started with."""
    if isinstance(info, dict):
        return {
            k: "[REDACTED]"
            if v and isinstance(v, str) and _SECRET_KEY.search(str(k))
            else scrub_server_info(v)
            for k, v in info.items()
        }
    if isinstance(info, list):
        return [scrub_server_info(v) for v in info]
    return info
