"""One streamed request against `/v1/completions`, `/v1/chat/completions` or SGLang's `/generate`.

The client must measure the server, not itself: the body arrives as raw bytes, one network read at
a time (`tools.bench.netstream`), is split into SSE lines by hand, timestamped once per read with
`time.perf_counter`, and each event is decoded with orjson into plain dicts (no per-token objects).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from orjson import loads as json_loads  # several times faster than json.loads on small events

from tools.bench.netstream import ConnectFailed, HttpClientError, RequestTimeout, StreamConnection
from tools.bench.prompts import Prompt
from tools.bench.results import RequestResult

API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "generate": "/generate"}


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
        state["cached_tokens"] = meta.get("cached_tokens")
        new = done - state["last"]
        state["last"] = done
        state["usage"] = done
        return max(new, 0)
    usage = event.get("usage")
    if usage:
        state["usage"] = usage.get("completion_tokens")
        state["prompt_tokens"] = usage.get("prompt_tokens")
        # SGLang reports them here only under --enable-cache-report
        state["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    choices = event.get("choices")
    if not choices:
        return 0
    choice = choices[0]
    piece = choice.get("text") if api == "completions" else (choice.get("delta") or {}).get("content")
    return 1 if piece else 0


class _SSEReader:
    """The sink of one streamed response: splits each network read into SSE lines, decodes the
    events, counts their tokens and timestamps them once per read (the tokens of one read arrived
    together, so their gaps share the time since the previous read)."""

    __slots__ = ("api", "state", "itl", "tokens", "ttft", "last", "start", "buf", "counter", "error")

    def __init__(self, api: str, start: float, counter: TokenCounter | None) -> None:
        self.api, self.start, self.last, self.counter = api, start, start, counter
        self.state: dict[str, Any] = {
            "last": 0, "usage": None, "prompt_tokens": None, "cached_tokens": None, "done": False
        }  # fmt: skip
        self.itl: list[float] = []
        self.tokens = 0
        self.ttft: float | None = None
        self.buf = b""
        self.error = b""

    def __call__(self, raw: bytes, now: float) -> None:
        buf = self.buf + raw if self.buf else raw
        if b"\n" not in raw:
            self.buf = buf
            return
        *lines, self.buf = buf.split(b"\n")
        api, state, n = self.api, self.state, 0
        for line in lines:
            if line[:5] != b"data:":
                continue
            try:
                event = json_loads(line[5:])  # orjson skips the blank after the colon
            except ValueError:
                data = line[5:].strip()
                if data == b"[DONE]":
                    state["done"] = True
                    continue
                raise StreamError(f"malformed stream: not JSON: {data[:80]!r}") from None
            n += _event_tokens(api, event, state)
        if not n:
            return
        if self.ttft is None:
            self.ttft = now - self.start
            self.itl.extend([0.0] * (n - 1))
        else:
            self.itl.extend([(now - self.last) * 1000.0 / n] * n)
        self.last = now
        self.tokens += n
        if self.counter is not None:
            self.counter.n += n

    def keep_error(self, raw: bytes, now: float) -> None:
        """The sink of a non-200 response: keeps the start of its body for the message."""
        if len(self.error) < 300:
            self.error += raw


async def send_request(
    conn: StreamConnection,
    path: str,
    api: str,
    body: bytes,
    *,
    input_len: int,
    timeout: float = 600.0,
    whole: float | None = None,
    counter: TokenCounter | None = None,
    t0: float = 0.0,
) -> RequestResult:
    """Send one streamed request (`body`: the JSON payload, already encoded) to `path` on `conn`
    and measure it; a server problem becomes a failed `RequestResult` with its cause, never an
    exception. `timeout`: seconds without a byte before the request counts as timed out; `whole`:
    seconds the request may take in all (None: no bound beyond `timeout`)."""
    start = time.perf_counter()
    reader = _SSEReader(api, start, counter)
    try:
        async with asyncio.timeout(whole):
            await conn.connect(min(timeout, 10.0))
            status, reason = await conn.post(
                path, body, reader, timeout=timeout, error_sink=reader.keep_error
            )
        end = time.perf_counter()
        if status != 200:
            text = reader.error[:300].decode("utf-8", "replace").strip()
            raise StreamError(f"HTTP {status}: {text or reason}")
        if not reader.state["done"]:
            raise StreamError("stream ended before [DONE]")
        if reader.ttft is None:
            raise StreamError("no output tokens in the response")
    except StreamError as e:
        return _failed(str(e), start, t0, input_len)
    except RequestTimeout as e:
        return _failed(f"timed out ({e.kind}: no byte for {timeout:g} s)", start, t0, input_len)
    except TimeoutError:
        return _failed(f"timed out (over {whole:g} s in all)", start, t0, input_len)
    except ConnectFailed as e:
        return _failed(f"cannot connect to {conn.endpoint}{path}: {e}", start, t0, input_len)
    except HttpClientError as e:
        return _failed(f"connection lost mid-stream: {e}", start, t0, input_len)
    state = reader.state
    output = state["usage"] if isinstance(state["usage"], int) and state["usage"] > 0 else reader.tokens
    prompt_tokens, cached = state["prompt_tokens"], state["cached_tokens"]
    return RequestResult(
        ok=True,
        input_tokens=prompt_tokens if isinstance(prompt_tokens, int) else input_len,
        cached_tokens=cached if isinstance(cached, int) and not isinstance(cached, bool) else None,
        output_tokens=output,
        ttft_ms=reader.ttft * 1000.0,
        e2e_ms=(end - start) * 1000.0,
        itl_ms=reader.itl,
        start_s=start - t0,
    )


def _failed(cause: str, start: float, t0: float, input_len: int) -> RequestResult:
    return RequestResult(ok=False, error=cause, input_tokens=input_len, start_s=start - t0)
