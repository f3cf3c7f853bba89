"""Is the server really serving? `/health`, then a real one-token generation, within a timeout.

An exit code of 0 from `systemctl restart` says nothing about health; only a generated token does.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from tools.auth import auth_headers
from tools.redact import redact

__all__ = ["HealthResult", "get_server_info", "wait_healthy", "generate_one_token"]

ProgressFn = Callable[[float, float, str], None]
"""on_progress(elapsed_s, timeout_s, phase) with phase "health" or "generate"."""
AliveFn = Callable[[], Awaitable[bool] | bool]


@dataclass(frozen=True)
class HealthResult:
    """Whether the server answered a one-token generation in time, and if not, why not."""

    ok: bool
    seconds: float
    reason: str = ""


async def _alive(is_alive: AliveFn | None) -> bool:
    if is_alive is None:
        return True
    value = is_alive()
    return bool(await value) if inspect.isawaitable(value) else bool(value)


async def generate_one_token(client: httpx.AsyncClient, endpoint: str) -> tuple[bool, str]:
    """Ask for one token with `/generate`, falling back to `/v1/completions`; (ok, detail)."""
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    r = await client.post(f"{endpoint}/generate", json=body)
    if r.status_code in (404, 405):
        model = "default"
        with contextlib.suppress(httpx.HTTPError, ValueError, LookupError, TypeError):
            models = (await client.get(f"{endpoint}/v1/models")).json().get("data") or []
            model = models[0]["id"] if models else model
        body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        r = await client.post(f"{endpoint}/v1/completions", json=body)
    if r.status_code != 200:
        return False, f"generation returned HTTP {r.status_code}: {r.text[:200]}"
    try:
        data = r.json()
    except ValueError:
        return False, "generation returned a body that is not JSON"
    if not isinstance(data, dict) or not ("text" in data or data.get("choices")):
        return False, f"generation returned no text: {str(data)[:200]}"
    return True, "generated one token"


async def wait_healthy(
    endpoint: str,
    *,
    timeout: float,
    is_alive: AliveFn | None = None,
    on_progress: ProgressFn | None = None,
    interval: float = 0.5,
    min_interval: float = 0.02,
    alive_every: float = 0.2,
    request_timeout: float = 30.0,
    api_key: str | None = None,
) -> HealthResult:
    """Poll until `/health` answers 200 and a one-token generation succeeds, or give up.

    Polls often at first and less as the wait grows (pauses of 5% of the time waited so far, between
    `min_interval` and `interval`), so a fast start is seen within a few ms and a slow one costs few
    requests. Gives up at `timeout` seconds, or as soon as `is_alive()` (asked at most every
    `alive_every` seconds) says the server process has died. `api_key` (default `$OPTAGENT_API_KEY`)
    is sent as a bearer token; `/health` needs none, but the generation does.
    """
    endpoint = endpoint.rstrip("/")
    start = time.monotonic()
    last, phase, alive_at = "no answer yet", "health", -alive_every
    timeouts = httpx.Timeout(request_timeout, connect=2.0)
    async with httpx.AsyncClient(timeout=timeouts, headers=auth_headers(api_key), trust_env=False) as client:
        while True:
            elapsed = time.monotonic() - start
            if on_progress is not None:
                on_progress(elapsed, timeout, phase)
            if elapsed - alive_at >= alive_every:
                alive_at = elapsed
                if not await _alive(is_alive):
                    return HealthResult(
                        False, time.monotonic() - start, f"the server process exited ({last})"
                    )
            try:
                r = await client.get(f"{endpoint}/health")
                if r.status_code == 200:
                    phase = "generate"
                    ok, last = await generate_one_token(client, endpoint)
                    if ok:
                        return HealthResult(True, time.monotonic() - start, last)
                else:
                    phase, last = "health", f"/health returned HTTP {r.status_code}"
            except httpx.HTTPError as e:
                phase, last = "health", f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            elapsed = time.monotonic() - start
            if elapsed >= timeout:
                return HealthResult(False, elapsed, f"not healthy after {timeout:g}s ({last})")
            pause = min(interval, max(min_interval, elapsed * 0.05))
            await asyncio.sleep(min(pause, timeout - elapsed))


async def get_server_info(
    endpoint: str, *, timeout: float = 10.0, api_key: str | None = None
) -> dict[str, Any]:
    """The server's `/get_server_info` (or `/server_info`) as a dict."""
    endpoint = endpoint.rstrip("/")
    async with httpx.AsyncClient(timeout=timeout, headers=auth_headers(api_key), trust_env=False) as client:
        r = await client.get(f"{endpoint}/get_server_info")
        if r.status_code == 404:
            r = await client.get(f"{endpoint}/server_info")
        r.raise_for_status()
        data = r.json()
    if not isinstance(data, dict):
        raise ValueError(f"{endpoint}: server info is not a JSON object")
    return redact(data)
