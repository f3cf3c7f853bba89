"""One streamed request against `/v1/completions`, `/v1/chat/completions` or SGLang's `/generate`.

The client must measure the server, not itself: the body is read as raw bytes, split into SSE
lines by hand, timestamped once per network read with `time.perf_counter`, and each event is
decoded with orjson into plain dicts (no per-token objects).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from orjson import loads as json_loads  # several times faster than json.loads on small events

from tools.bench.prompts import Prompt
from tools.bench.results import RequestResult

API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "generate": "/generate"}


_JSON = {"content-type": "application/json"}


class TokenCounter:
    """A shared count of streamed output tokens, read by the live progress display."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class StreamError(Exception):
    """The response stream was not what the API promises; the message is the cause."""


def build_payload(api: str, prompt: Prompt, *, model: str, temperature: float = 0.0) -> dict[str, Any]:
    """The JSON body asking for exactly `prompt.output_len` tokens, streamed."""
    body: Any = prompt.token_ids if prompt.token_ids is not None else prompt.text
    if api == "generate":
        key = "input_ids" if prompt.token_ids is not None else "text"
        sampling = {"max_new_tokens": prompt.output_len, "temperature": temperature, "ignore_eos": True}
        return {key: body, "sampling_params": sampling, "stream": True}
    payload: dict[str, Any] = {
        "model": model,
        "max_tokens": prompt.output_len,
        "temperature": temperature,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "chat":
        text = body if isinstance(body, str) else " ".join(map(str, body))
        payload["messages"] = [{"role": "user", "content": text}]
    else:
        payload["prompt"] = body
    return payload


def _event_tokens(api: str, event: dict[str, Any], state: dict[str, Any]) -> int:
    """How many new output tokens one decoded SSE event carries; records usage in `state`."""
    if "error" in event:
        err = event["error"]
        raise StreamError(
            f"server error in stream: {err.get('message', err) if isinstance(err, dict) else err}"
        )
    if api == "generate":
        meta = event.get("meta_info") or {}
        done = meta.get("completion_tokens")
        if done is None:
            raise StreamError("malformed stream: /generate event without meta_info.completion_tokens")
        state["prompt_tokens"] = meta.get("prompt_tokens")
        new = done - state["last"]
        state["last"] = done
        state["usage"] = done
        return max(new, 0)
    usage = event.get("usage")
    if usage:
        state["usage"] = usage.get("completion_tokens")
        state["prompt_tokens"] = usage.get("prompt_tokens")
    choices = event.get("choices")
    if not choices:
        return 0
    choice = choices[0]
    piece = choice.get("text") if api == "completions" else (choice.get("delta") or {}).get("content")
    return 1 if piece else 0


async def send_request(
    client: httpx.AsyncClient,
    url: str,
    api: str,
    body: bytes,
    *,
    input_len: int,
    counter: TokenCounter | None = None,
    t0: float = 0.0,
) -> RequestResult:
    """Send one streamed request (`body`: the JSON payload, already encoded) to `url` and measure
    it; a server problem becomes a failed `RequestResult` with its cause, never an exception."""
    state: dict[str, Any] = {"last": 0, "usage": None, "prompt_tokens": None, "done": False}
    itl: list[float] = []
    chunks = 0
    start = time.perf_counter()
    last = start
    ttft = None
    try:
        async with client.stream("POST", url, content=body, headers=_JSON) as resp:
            if resp.status_code != 200:
                body = (await resp.aread())[:300].decode("utf-8", "replace").strip()
                raise StreamError(f"HTTP {resp.status_code}: {body or resp.reason_phrase}")
            buf = b""
            async for raw in resp.aiter_raw():
                now = time.perf_counter()
                buf += raw
                if b"\n" not in raw:
                    continue
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        state["done"] = True
                        continue
                    try:
                        event = json_loads(data)
                    except ValueError:
                        raise StreamError(f"malformed stream: not JSON: {data[:80]!r}") from None
                    n = _event_tokens(api, event, state)
                    if not n:
                        continue
                    if ttft is None:
                        ttft = now - start
                    else:
                        gap = (now - last) * 1000.0 / n
                        itl.extend([gap] * n)
                    last = now
                    chunks += n
                    if counter is not None:
                        counter.n += n
        end = time.perf_counter()
        if not state["done"]:
            raise StreamError("stream ended before [DONE]")
        if ttft is None:
            raise StreamError("no output tokens in the response")
    except StreamError as e:
        return _failed(str(e), start, t0, input_len)
    except httpx.TimeoutException as e:
        return _failed(f"timed out ({type(e).__name__})", start, t0, input_len)
    except httpx.ConnectError as e:
        return _failed(f"cannot connect to {url}: {str(e) or type(e).__name__}", start, t0, input_len)
    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
        return _failed(f"connection lost mid-stream: {str(e) or type(e).__name__}", start, t0, input_len)
    except httpx.HTTPError as e:
        return _failed(f"{type(e).__name__}: {e}", start, t0, input_len)
    output = state["usage"] if isinstance(state["usage"], int) and state["usage"] > 0 else chunks
    prompt_tokens = state["prompt_tokens"]
    return RequestResult(
        ok=True,
        input_tokens=prompt_tokens if isinstance(prompt_tokens, int) else input_len,
        output_tokens=output,
        ttft_ms=ttft * 1000.0,
        e2e_ms=(end - start) * 1000.0,
        itl_ms=itl,
        start_s=start - t0,
    )


def _failed(cause: str, start: float, t0: float, input_len: int) -> RequestResult:
    return RequestResult(ok=False, error=cause, input_tokens=input_len, start_s=start - t0)
