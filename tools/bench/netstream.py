"""A small HTTP/1.1 client for streamed POSTs: one keep-alive connection, read by an asyncio Protocol.

The benchmark client must spend far less CPU than the server it measures. httpx parses a response
with h11 (pure Python, one parse step per SSE chunk: a third of the client's CPU at thousands of
tokens per second) and wakes a coroutine per network read. Here the event loop hands each read to
`data_received`, which removes the chunked framing with a few `bytes.find` calls and passes the
payload of the whole read to a sink at once; the awaiting coroutine wakes only when the response
ends. Everything that is not a measured stream (server info, health) still goes through httpx:
`ClientPool` holds a level's connections, one per concurrency slot, and that httpx client.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx

from tools.auth import auth_headers

Sink = Callable[[bytes, float], None]
"""Receives the body bytes of one network read and the `perf_counter` time they arrived."""

_MAX_HEAD = 64 * 1024


class HttpClientError(Exception):
    """A request that did not get a whole response; subclasses say why."""


class ConnectFailed(HttpClientError):
    """The TCP (or TLS) connection could not be opened."""


class ConnectionLost(HttpClientError):
    """The server closed the connection (or broke HTTP) before the response ended."""


class RequestTimeout(HttpClientError):
    """No byte arrived for the whole timeout (`kind`: connect or read)."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"{kind} timed out")
        self.kind = kind


class _Response(asyncio.Protocol):
    """The connection's protocol: parses one response at a time into `sink`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.sink: Sink | None = None
        self.done: asyncio.Future[None] | None = None
        self.last_read = 0.0
        self.status, self.reason, self.mode = 0, "", "close"

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.done is not None and not self.done.done():
            if self.mode == "close" and self.status:
                self.done.set_result(None)  # a body delimited by the end of the connection
            else:
                self.done.set_exception(ConnectionLost(str(exc) if exc else "server closed the connection"))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.last_read = now
        if self.done is None or self.done.done():
            self.lost = True  # bytes nobody asked for: this connection cannot be reused
            return
        try:
            if not self.status:
                data = self._head(data)
                if not self.status:
                    return
            if self.mode == "chunked":
                self._chunked(data, now)
            elif self.mode == "length":
                self._sized(data, now)
            elif data:
                self.sink(data, now)  # type: ignore[misc]
        except Exception as e:  # a sink's verdict on the stream, or broken framing
            self.lost = True
            if self.transport is not None:
                self.transport.close()
            if not self.done.done():
                self.done.set_exception(e)

    # -- one response ------------------------------------------------------------------------
    def begin(self, sink: Sink, error_sink: Sink | None = None) -> asyncio.Future[None]:
        self.sink, self.error_sink, self.status, self.headers = sink, error_sink, 0, {}
        self.mode, self.need, self.buf, self.head = "close", 0, b"", b""
        self.done = asyncio.get_running_loop().create_future()
        self.last_read = time.perf_counter()
        return self.done

    def _head(self, data: bytes) -> bytes:
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > _MAX_HEAD:
                raise ConnectionLost("response head too large")
            return b""
        lines = self.head[:end].decode("latin-1").split("\r\n")
        rest, self.head = self.head[end + 4 :], b""
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ConnectionLost(f"not an HTTP/1.1 response: {lines[0][:80]!r}")
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self.status = int(parts[1])
        self.reason = parts[2] if len(parts) > 2 else ""
        if self.status != 200 and self.error_sink is not None:
            self.sink = self.error_sink
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self.mode = "chunked"
        elif "content-length" in self.headers:
            self.mode, self.need = "length", int(self.headers["content-length"])
            if self.need == 0:
                self.done.set_result(None)  # type: ignore[union-attr]
        if self.headers.get("connection", "").lower() == "close":
            self.lost = True
        return rest

    def _sized(self, data: bytes, now: float) -> None:
        data = data[: self.need]
        self.need -= len(data)
        if data:
            self.sink(data, now)  # type: ignore[misc]
        if self.need == 0 and not self.done.done():  # type: ignore[union-attr]
            self.done.set_result(None)  # type: ignore[union-attr]

    def _chunked(self, data: bytes, now: float) -> None:
        """Strip the chunked framing off one read; the payload goes to the sink in one call. Most
        reads hold whole chunks (`size CRLF data CRLF`): one `find` and one slice per chunk."""
        buf = self.buf + data if self.buf else data
        pos, end, need, out = 0, len(buf), self.need, []
        while pos < end:
            if need > 0:  # the rest of a chunk cut by the previous read: its data, then CRLF
                take = min(need, end - pos)
                if need > 2:
                    out.append(buf[pos : pos + min(take, need - 2)])
                pos, need = pos + take, need - take
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            if need < 0:  # trailers after the last chunk, ended by an empty line
                if eol == pos:
                    self.done.set_result(None)  # type: ignore[union-attr]
                    pos = end
                    break
                pos = eol + 2
                continue
            line = buf[pos:eol]
            size = int(line if b";" not in line else line.split(b";", 1)[0], 16)
            if size == 0:
                pos, need = eol + 2, -1
                continue
            start, stop = eol + 2, eol + 2 + size
            if stop + 2 <= end:
                if buf[stop : stop + 2] != b"\r\n":
                    raise ConnectionLost("malformed chunked body")
                out.append(buf[start:stop])
                pos = stop + 2
            else:
                pos, need = start, size + 2
        self.buf, self.need = buf[pos:], need
        if out:
            self.sink(out[0] if len(out) == 1 else b"".join(out), now)  # type: ignore[misc]


class StreamConnection:
    """One keep-alive HTTP/1.1 connection to `endpoint` (`http://` or `https://`)."""

    def __init__(
        self, endpoint: str, *, headers: dict[str, str] | None = None, tls: ssl.SSLContext | None = None
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        url = urlsplit(endpoint)
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = (tls or ssl.create_default_context()) if url.scheme == "https" else None
        host_header = url.netloc.rsplit("@", 1)[-1]
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._headers = f"Host: {host_header}\r\n{extra}".encode("latin-1")
        self._proto: _Response | None = None

    @property
    def connected(self) -> bool:
        return self._proto is not None and not self._proto.lost

    async def connect(self, timeout: float = 10.0) -> None:
        """Open the connection unless an idle one is still good."""
        if self.connected:
            return
        self.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, proto = await loop.create_connection(
                    _Response, self.host, self.port, ssl=self.tls,
                    server_hostname=self.host if self.tls else None,
                )  # fmt: skip
        except TimeoutError:
            raise RequestTimeout("connect") from None
        except OSError as e:
            raise ConnectFailed(str(e) or type(e).__name__) from e
        self._proto = proto

    async def post(
        self,
        path: str,
        body: bytes,
        sink: Sink,
        *,
        timeout: float,
        error_sink: Sink | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, str]:
        """POST `body` and feed the response body to `sink` read by read (to `error_sink`, when
        given, if the status is not 200); returns (status, reason) once the response has ended. Raises an `HttpClientError` (and drops the connection) when
        it cannot end; whatever `sink` raises ends the response and is raised here."""
        head = (
            f"POST {path} HTTP/1.1\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Accept: text/event-stream\r\n"
        ).encode("latin-1")
        request = head + self._headers + b"\r\n" + body
        for attempt in (0, 1):
            reused = self.connected
            await self.connect(min(timeout, 10.0))
            proto = self._proto
            assert proto is not None and proto.transport is not None
            done = proto.begin(sink, error_sink)
            proto.transport.write(request)
            try:
                await self._wait(proto, done, timeout)
                return proto.status, proto.reason
            except ConnectionLost:
                self.close()
                # An idle keep-alive connection the server closed as we wrote: once more on a new one.
                if attempt or not reused or proto.status:
                    raise
            except BaseException:
                _settle(done)  # cancelled or timed out: nobody will read what the drop sets on it
                self.close()
                raise
        raise AssertionError("unreachable")

    @staticmethod
    async def _wait(proto: _Response, done: asyncio.Future[None], timeout: float) -> None:
        """Wait for `done`, failing after `timeout` seconds without a byte (like a read timeout)."""
        wait = timeout
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(done), wait)
                return
            except TimeoutError:
                idle = time.perf_counter() - proto.last_read
                if idle >= timeout:
                    raise RequestTimeout("read") from None
                wait = timeout - idle

    def close(self) -> None:
        """Drop the connection (the next request opens a new one)."""
        if self._proto is not None and self._proto.transport is not None:
            self._proto.lost = True
            self._proto.transport.close()
        self._proto = None


def _settle(done: asyncio.Future[None]) -> None:
    """Cancel a response's future nobody waits for any more, or mark its failure as read."""
    if not done.done():
        done.cancel()
    elif not done.cancelled():
        done.exception()


class ClientPool:
    """One keep-alive streaming connection per concurrency slot, and one httpx client for the rest.

    Each slot's requests go one after another over its own connection (`StreamConnection`): no
    pool to rescan, no h11 (see `tools.bench.netstream`). Server info and other small calls use
    the httpx client.
    """

    def __init__(
        self,
        endpoint: str,
        slots: int,
        timeout_s: float,
        *,
        stall_s: float | None = None,
        api_key: str | None = None,
    ) -> None:
        headers = auth_headers(api_key)  # a server started with --api-key answers 401 without it
        tls = ssl.create_default_context() if endpoint.startswith("https://") else None
        self.timeout_s = timeout_s
        self.stall_s = min(stall_s or timeout_s, timeout_s)
        """Seconds without a byte before a request times out (`timeout_s` bounds it in all)."""
        self.slots = [StreamConnection(endpoint, headers=headers, tls=tls) for _ in range(slots)]
        # trust_env=False: a proxy from the environment must never sit between us and the server.
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            trust_env=False,
            headers=headers,
            verify=tls or True,
        )

    async def preconnect(self, n: int) -> None:
        """Open the keep-alive connections slots 0..n-1 will use, so that TCP setup and the
        client's burst of `n` connects stay out of the measured window."""

        async def touch(slot: int) -> None:
            with contextlib.suppress(HttpClientError):
                await self[slot].connect(min(self.timeout_s, 10.0))

        await asyncio.gather(*(touch(slot) for slot in range(n)))

    def __getitem__(self, slot: int) -> StreamConnection:
        return self.slots[slot % len(self.slots)]

    async def __aenter__(self) -> ClientPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for conn in self.slots:
            conn.close()
        await self.client.aclose()
