"""A plain-asyncio network backend for httpx's HTTP/1.1 connections to `http://` endpoints.

httpcore's default backend goes through anyio: every socket read costs cancel-scope and
typed-attribute machinery, which at thousands of streamed tokens per second is a third of the
client's CPU. This backend reads with `asyncio.StreamReader` directly; httpx still does all of
the HTTP. (TLS endpoints keep the default backend.)
"""

from __future__ import annotations

import asyncio
import select
import socket
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

_READ_LIMIT = 1 << 20


def _readable(sock: socket.socket | None) -> bool:
    """True if an idle keep-alive socket has data or EOF waiting: the server closed it."""
    if sock is None or sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One TCP connection as httpcore sees it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as e:
            raise httpcore.ReadTimeout(str(e) or "read timed out") from e
        except OSError as e:
            raise httpcore.ReadError(str(e) or type(e).__name__) from e

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            async with asyncio.timeout(timeout):
                self._writer.write(buffer)
                await self._writer.drain()
        except TimeoutError as e:
            raise httpcore.WriteTimeout(str(e) or "write timed out") from e
        except OSError as e:
            raise httpcore.WriteError(str(e) or type(e).__name__) from e

    async def aclose(self) -> None:
        self._writer.close()

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return _readable(self._writer.get_extra_info("socket"))
        names = {"socket": "socket", "client_addr": "sockname", "server_addr": "peername"}
        return self._writer.get_extra_info(names[info]) if info in names else None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """Opens `AsyncioStream`s (plain TCP only)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        local = (local_address, 0) if local_address else None
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, limit=_READ_LIMIT, local_addr=local
                )
        except TimeoutError as e:
            raise httpcore.ConnectTimeout(f"connect to {host}:{port} timed out") from e
        except OSError as e:
            raise httpcore.ConnectError(str(e) or type(e).__name__) from e
        sock = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def single_connection_transport(endpoint: str, *, verify: Any) -> httpx.AsyncHTTPTransport:
    """An httpx transport holding one keep-alive connection, on `AsyncioBackend` for http://."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    transport = httpx.AsyncHTTPTransport(limits=limits, verify=verify)
    if endpoint.startswith("http://"):
        # httpx does not expose httpcore's `network_backend`; its transport keeps the pool here.
        transport._pool = httpcore.AsyncConnectionPool(
            max_connections=1,
            max_keepalive_connections=1,
            keepalive_expiry=5.0,
            network_backend=AsyncioBackend(),
        )
    return transport
