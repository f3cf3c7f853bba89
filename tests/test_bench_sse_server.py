"""A minimal OpenAI/SGLang-shaped streaming server on loopback for the benchmark tests.

Real HTTP/1.1 (keep-alive, chunked SSE) over a real socket, in a thread with its own event loop,
so tests and CLI runs talk to it exactly as to a server. Knobs let a test make it slow, wrong or
dead. It is replaced by the simulator (`tests/fixtures/sim.py`) where that fits.
"""

from __future__ import annotations

import asyncio
import json
import threading
import zlib
from dataclasses import dataclass

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
]


@dataclass
class Behaviour:
    ttft_s: float = 0.002
    itl_s: float = 0.0005
    die_after: int | None = None
    """Stop serving (close every connection, stop listening) once this many requests started."""
    malformed: bool = False
    status: int = 200
    no_done: bool = False
    probe_mode: str = "normal"
    """normal | drift (changes after 10 words) | repeat (degenerate) | empty."""
    hang_after: int | None = None
    """Once this many requests started, each later one sends its first piece (streamed) and then
    nothing more, its connection left open: a server stuck mid-stream."""


def answer(prompt: str, n: int, mode: str = "normal") -> list[str]:
    """Deterministic 'generation': word pieces derived from the prompt."""
    seed = zlib.crc32(prompt.encode())
    words = [" " + WORDS[(seed + i * 7 + i * i) % len(WORDS)] for i in range(n)]
    if mode == "drift":
        words = words[:10] + [" omega" + WORDS[(seed + i * i + 5 * i) % len(WORDS)] for i in range(n - 10)]
    elif mode == "repeat":
        words = [" the"] * n
    elif mode == "empty":
        words = []
    return words


HANG = "<hang>"
"""Where a hanging response stops sending."""


class SSEServer:
    """`with SSEServer() as srv:` serves on `srv.endpoint` until the block ends."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.b = behaviour or Behaviour()
        self.requests = 0
        self.tokens_sent = 0
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SSEServer:
        self._thread.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    async def _shutdown(self) -> None:
        self._die()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def _die(self) -> None:
        self._server.close()
        for w in list(self._writers):
            w.transport.abort()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)
                }
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                await self._route(method, path, json.loads(body) if body else {}, writer)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, status: int, obj: object) -> None:
        data = json.dumps(obj).encode()
        head = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
        writer.write(head.encode() + data)
        await writer.drain()

    async def _route(self, method: str, path: str, req: dict, writer: asyncio.StreamWriter) -> None:
        if path == "/get_server_info":
            return await self._send(writer, 200, {"version": "0.0-test", "served_model_name": "test-model"})
        if path == "/health":
            return await self._send(writer, 200, {})
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions", "/generate"):
            return await self._send(writer, 404, {"detail": "Not Found"})
        self.requests += 1
        if self.b.die_after is not None and self.requests > self.b.die_after:
            self._die()
            return
        if self.b.status != 200:
            return await self._send(writer, self.b.status, {"error": {"message": "boom"}})
        if path == "/generate":
            n, prompt = req["sampling_params"]["max_new_tokens"], str(req.get("input_ids") or req.get("text"))
        else:
            n = req["max_tokens"]
            prompt = str(req["messages"][-1]["content"] if "messages" in req else req["prompt"])
        pieces = answer(prompt, n, self.b.probe_mode)
        if self.b.hang_after is not None and self.requests > self.b.hang_after:
            pieces = [*pieces[:1], HANG]
        if not req.get("stream"):
            if HANG in pieces:
                await asyncio.sleep(3600)
            await asyncio.sleep(self.b.ttft_s + len(pieces) * self.b.itl_s)  # generated whole, then sent
            text = "".join(pieces)
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(pieces)}
            return await self._send(writer, 200, {"choices": [{"text": text, "index": 0}], "usage": usage})
        await self._stream(path, req, pieces, writer)

    async def _stream(self, path: str, req: dict, pieces: list[str], writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )

        def event(data: bytes) -> None:
            frame = b"data: " + data + b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))

        await asyncio.sleep(self.b.ttft_s)
        text = ""
        for i, piece in enumerate(pieces):
            if piece is HANG:
                await asyncio.sleep(3600)
            if i:
                await asyncio.sleep(self.b.itl_s)
            if self.b.malformed and i == 2:
                event(b"{not json")
                continue
            text += piece
            if path == "/generate":
                obj = {"text": text, "meta_info": {"completion_tokens": i + 1, "prompt_tokens": 5}}
            elif path == "/v1/chat/completions":
                obj = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            else:
                obj = {"choices": [{"index": 0, "text": piece}]}
            event(json.dumps(obj).encode())
            self.tokens_sent += 1
            await writer.drain()
        if path != "/generate" and (req.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 5, "completion_tokens": len(pieces)}
            event(json.dumps({"choices": [], "usage": usage}).encode())
        if not self.b.no_done:
            event(b"[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
