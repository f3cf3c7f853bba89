"""A small HTTP/1.1 server on asyncio streams and h11: cheap enough to stream to many clients."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11


@dataclass
class HttpRequest:
    method: str
    path: str
    body: bytes
    authorization: str | None = None
    """The `Authorization` header, for `--api-key`."""

    def json(self) -> Any:
        """The body as JSON; raises `HttpError(400)` when it is not."""
        try:
            return json.loads(self.body or b"{}")
        except json.JSONDecodeError as e:
            raise HttpError(400, f"request body is not valid JSON: {e}") from e


class HttpError(Exception):
    """Turns into an error response with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    stream: AsyncIterator[bytes] | None = None
    """Chunks of a streamed (chunked transfer encoding) body, e.g. server-sent events."""


def _reason(status: int) -> str:
    """The HTTP reason phrase SGLang puts in an error body's `type` ("Bad Request")."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(obj).encode())


Handler = Callable[[HttpRequest], Awaitable[Response]]


async def _send(writer: asyncio.StreamWriter, conn: h11.Connection, event: Any) -> None:
    data = conn.send(event)
    if data:
        writer.write(data)
        await writer.drain()


async def _read_request(reader: asyncio.StreamReader, conn: h11.Connection) -> HttpRequest | None:
    req, body = None, bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            req = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage) and req is not None:
            path = req.target.decode("latin-1").split("?", 1)[0]
            auth = next((v.decode("latin-1") for k, v in req.headers if k == b"authorization"), None)
            return HttpRequest(req.method.decode(), path, bytes(body), auth)
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None


async def _respond(writer: asyncio.StreamWriter, conn: h11.Connection, resp: Response) -> None:
    headers = [("content-type", resp.content_type), ("server", "sglang-sim")]
    if resp.stream is None:
        headers.append(("content-length", str(len(resp.body))))
        await _send(writer, conn, h11.Response(status_code=resp.status, headers=headers))
        if resp.body:
            await _send(writer, conn, h11.Data(data=resp.body))
    else:
        headers.append(("cache-control", "no-cache"))
        await _send(writer, conn, h11.Response(status_code=resp.status, headers=headers))
        try:
            async for chunk in resp.stream:
                await _send(writer, conn, h11.Data(data=chunk))
        finally:
            await resp.stream.aclose()  # type: ignore[attr-defined]
    await _send(writer, conn, h11.EndOfMessage())


async def serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler
) -> None:
    """Serve requests on one keep-alive connection until the client closes it."""
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            try:
                req = await _read_request(reader, conn)
            except h11.RemoteProtocolError:
                return
            if req is None:
                return
            try:
                resp = await handler(req)
            except HttpError as e:
                body = {"object": "error", "message": e.message, "type": _reason(e.status), "param": None}
                resp = json_response({**body, "code": e.status}, e.status)
            await _respond(writer, conn, resp)
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except (ConnectionError, h11.LocalProtocolError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()
