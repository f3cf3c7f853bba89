"""The server's API key: SGLang started with `--api-key` answers 401 to every API request without it.

The key comes from `target.api_key` in optagent.toml or, better (a config file is easy to share), from
the `OPTAGENT_API_KEY` environment variable. It is sent as `Authorization: Bearer KEY` on every request
to the server; `tools.redact` hides it in everything optagent prints or saves.
"""

from __future__ import annotations

import os

__all__ = ["API_KEY_ENV", "api_key", "auth_headers", "export_api_key"]

API_KEY_ENV = "OPTAGENT_API_KEY"


def api_key(configured: str | None = None) -> str | None:
    """`configured`, else `$OPTAGENT_API_KEY`, else None (an empty value means none)."""
    return configured or os.environ.get(API_KEY_ENV) or None


def auth_headers(configured: str | None = None) -> dict[str, str]:
    """`{"Authorization": "Bearer KEY"}` when a key is known, else `{}`."""
    key = api_key(configured)
    return {"Authorization": f"Bearer {key}"} if key else {}


def export_api_key(configured: str | None) -> None:
    """Make a key from the config file visible to every request this process makes (and to
    `tools.redact`, which hides `$OPTAGENT_API_KEY`'s value wherever it appears)."""
    if configured and not os.environ.get(API_KEY_ENV):
        os.environ[API_KEY_ENV] = configured
