"""A server that hangs in the middle of a stream during a benchmark (issue 27, item 8): the sweep
ends within the request timeout, the hung requests are counted as failed with their cause, and the
result says it is partial (a trial then rolls back instead of deciding on it). Real HTTP on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tools.bench.loadgen import run_sweep
from tools.config import BenchConfig

pytestmark = pytest.mark.server

CHUNK = b'data: {"choices": [{"text": " tok", "index": 0}]}\n\n'


def _serve(listener: socket.socket, stop: threading.Event) -> None:
    """Answers /v1/models, then streams two tokens of every completion and goes silent."""
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        held.append(conn)
        threading.Thread(target=_handle, args=(conn,), daemon=True).start()
    for conn in held:
        conn.close()


def _handle(conn: socket.socket) -> None:
    try:
        while True:
            request = b""
            while b"\r\n\r\n" not in request:
                data = conn.recv(65536)
                if not data:
                    return
                request += data
            head, _, body = request.partition(b"\r\n\r\n")
            length = next(
                (
                    int(h.split(b":")[1])
                    for h in head.split(b"\r\n")
                    if h.lower().startswith(b"content-length")
                ),
                0,
            )
            while len(body) < length:
                body += conn.recv(65536)
            if head.startswith(b"GET"):
                payload = b'{"data": [{"id": "m"}]}'
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(payload), payload)
                )
                continue
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            for _ in range(2):
                conn.sendall(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
            time.sleep(3600)  # hangs mid-stream, connection open
    except OSError:
        return


@pytest.fixture
def hanging_server() -> Iterator[str]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    stop = threading.Event()
    thread = threading.Thread(target=_serve, args=(listener, stop), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_a_stream_that_hangs_midway_ends_the_level_within_the_timeout(hanging_server: str) -> None:
    settings = BenchConfig(
        concurrency=[1, 2],
        input_len=8,
        output_len=16,
        prompts_per_level=2,
        warmup=0,
        reps=1,
        request_timeout_s=2.0,
    )
    started = time.monotonic()
    result = asyncio.run(run_sweep(hanging_server, settings))
    took = time.monotonic() - started
    assert took < 20, took  # bounded by the request timeout, not by the hang
    assert result.partial
    # the first request that times out stops the sweep: the rest of its level and the next level
    # are never sent (a server that stopped answering would hold each of them as long)
    assert sum(lv.failed for lv in result.levels) == 1 and sum(lv.completed for lv in result.levels) == 0
    assert any("a request stalled at concurrency 1" in e for e in result.errors), result.errors
    causes = [r.error or "" for lv in result.levels for r in lv.requests]
    assert causes and all("timed out" in c for c in causes), causes
