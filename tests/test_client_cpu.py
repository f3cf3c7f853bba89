"""The benchmark's own HTTP/1.1 streaming client (tools.bench.netstream): chunked framing cut at any
byte, keep-alive reuse, a keep-alive connection the server closed, error bodies, silence. Real
sockets on loopback; the parser test feeds the connection's protocol the bytes a socket would."""

from __future__ import annotations

import asyncio

import pytest

from tools.bench.netstream import ConnectFailed, ConnectionLost, RequestTimeout, StreamConnection, _Response
from tools.bench.streaming import TokenCounter, send_request

EVENTS = [b'data: {"choices":[{"index":0,"text":" w%d"}]}\n\n' % i for i in range(5)]
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}\n\n'
SSE = b"".join(EVENTS) + USAGE + b"data: [DONE]\n\n"


def chunked(payloads: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
RESPONSE = HEAD + chunked([*EVENTS, USAGE, b"data: [DONE]\n\n"])


def test_chunked_body_cut_at_every_byte_gives_the_same_payload():
    async def parse(cuts: list[int]) -> bytes:
        proto, got = _Response(), []
        done = proto.begin(lambda data, now: got.append(data))
        pieces = [RESPONSE[a:b] for a, b in zip([0, *cuts], [*cuts, len(RESPONSE)], strict=True)]
        for piece in pieces:
            proto.data_received(piece)
        assert done.done() and done.exception() is None
        return b"".join(got)

    async def main() -> None:
        for cut in range(1, len(RESPONSE)):
            assert await parse([cut]) == SSE, cut
        assert await parse(list(range(1, len(RESPONSE)))) == SSE  # one byte per read

    asyncio.run(main())


class Server:
    """A loopback HTTP/1.1 server answering every POST with `replies` in turn (raw bytes)."""

    def __init__(self, replies: list[bytes | None], *, close_after: bool = False) -> None:
        self.replies, self.close_after, self.requests, self.connections = replies, close_after, [], 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.replies:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                self.requests.append((head, await reader.readexactly(length)))
                reply = self.replies.pop(0)
                if reply is None:  # stay silent
                    await asyncio.sleep(30)
                writer.write(reply)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


def test_requests_share_one_keep_alive_connection_and_count_tokens():
    async def main() -> None:
        srv = Server([RESPONSE, RESPONSE])
        async with srv as endpoint:
            conn, counter = StreamConnection(endpoint, headers={"Authorization": "Bearer k"}), TokenCounter()
            results = [
                await send_request(
                    conn, "/v1/completions", "completions", b'{"a":1}', input_len=3, counter=counter
                )
                for _ in range(2)
            ]
            conn.close()
        assert srv.connections == 1 and len(srv.requests) == 2
        head, body = srv.requests[0]
        assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n") and b"Authorization: Bearer k" in head
        assert body == b'{"a":1}'
        for r in results:
            assert r.ok and r.output_tokens == 5 and r.input_tokens == 3 and len(r.itl_ms) == 4
        assert counter.n == 10

    asyncio.run(main())


def test_a_keep_alive_connection_the_server_closed_is_replaced():
    async def main() -> None:
        srv = Server([RESPONSE, RESPONSE], close_after=True)
        async with srv as endpoint:
            conn = StreamConnection(endpoint)
            first = await send_request(conn, "/v1/completions", "completions", b"{}", input_len=1)
            await asyncio.sleep(0.05)  # the server has closed the idle connection by now
            second = await send_request(conn, "/v1/completions", "completions", b"{}", input_len=1)
            conn.close()
        assert first.ok and second.ok and srv.connections == 2

    asyncio.run(main())


def test_error_status_keeps_the_body_as_the_cause():
    body = b'{"error": "model overloaded"}'
    reply = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)

    async def main() -> None:
        async with Server([reply]) as endpoint:
            conn = StreamConnection(endpoint)
            r = await send_request(conn, "/v1/completions", "completions", b"{}", input_len=1)
            conn.close()
        assert not r.ok and r.error == 'HTTP 503: {"error": "model overloaded"}'

    asyncio.run(main())


def test_silence_times_out_and_a_cut_stream_is_lost():
    cut = HEAD + chunked(EVENTS[:2])[:-5]  # two events, then the server hangs up mid-body

    async def main() -> None:
        async with Server([None]) as endpoint:
            conn = StreamConnection(endpoint)
            with pytest.raises(RequestTimeout):
                await conn.post("/v1/completions", b"{}", lambda d, t: None, timeout=0.3)
            assert not conn.connected
        async with Server([cut], close_after=True) as endpoint:
            r = await send_request(
                StreamConnection(endpoint), "/v1/completions", "completions", b"{}", input_len=1
            )
        assert not r.ok and r.error.startswith("connection lost mid-stream")
        with pytest.raises(ConnectFailed):
            await StreamConnection(endpoint).connect(1.0)  # the server is gone

    asyncio.run(main())


def test_a_broken_response_head_is_a_lost_connection():
    async def main() -> None:
        async with Server([b"SPDY/3 nonsense\r\n\r\n"]) as endpoint:
            conn = StreamConnection(endpoint)
            with pytest.raises(ConnectionLost, match="not an HTTP/1.1 response"):
                await conn.post("/x", b"{}", lambda d, t: None, timeout=5)

    asyncio.run(main())


def test_a_cancelled_request_leaves_no_unread_failure_behind():
    """Ctrl-C in a trial cancels requests mid-stream: dropping the connection must not leave a
    future failing later with nobody to read it ("Future exception was never retrieved")."""
    import gc

    unread: list[dict] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: unread.append(ctx))
        async with Server([None]) as endpoint:  # a server that never answers
            conn = StreamConnection(endpoint)
            task = asyncio.create_task(conn.post("/v1/completions", b"{}", lambda d, t: None, timeout=30))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.2)  # the transport's connection_lost runs now
            gc.collect()
            await asyncio.sleep(0)

    asyncio.run(main())
    gc.collect()
    ours = [c for c in unread if isinstance(c.get("exception"), ConnectionLost)]  # not the test server's
    assert not ours, ours
