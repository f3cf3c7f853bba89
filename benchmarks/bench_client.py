"""How fast can optagent's benchmark client stream, and does it report the server's true rate?

Starts a minimal continuous-batching SSE server in a separate process: every `tick` it writes
one token event to every active stream (like a decode step of a batch). The client
(`tools.bench.loadgen.run_sweep`, per-token timestamps on) runs at concurrency 256 against it at
rising tick rates. For each rate the script prints the client's reported output tok/s, the rate
the server itself measured, their difference, and the client's CPU time per 1,000 tokens.

    python benchmarks/bench_client.py [--concurrency 256] [--output-len 200]

Targets: >= 20,000 streamed tok/s on one core at concurrency 256; reported within 2% of the truth.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


# --- the server (runs in its own process) -------------------------------------------------------


class BatchServer:
    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        self.active: dict[asyncio.StreamWriter, list] = {}
        self.tokens = 0
        self.first_arrival: float | None = None
        self.last_write = 0.0

    async def ticker(self) -> None:
        next_t = time.perf_counter()
        while True:
            next_t += self.tick_s
            await asyncio.sleep(max(0.0, next_t - time.perf_counter()))
            wrote = bool(self.active)
            for writer, state in list(self.active.items()):
                state[0] -= 1
                frame = b'data: {"choices":[{"index":0,"text":" tok"}]}\n\n'
                if state[0] == 0:
                    usage = {"prompt_tokens": 16, "completion_tokens": state[1]}
                    frame += (
                        b"data: "
                        + json.dumps({"choices": [], "usage": usage}).encode()
                        + b"\n\ndata: [DONE]\n\n"
                    )
                writer.write(b"%x\r\n%s\r\n" % (len(frame), frame) + (b"0\r\n\r\n" if state[0] == 0 else b""))
                self.tokens += 1
                if state[0] == 0:
                    del self.active[writer]
                    state[2].set()
            if wrote:
                self.last_write = time.perf_counter()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                length = next(
                    (
                        int(ln.split(":")[1])
                        for ln in head.split("\r\n")
                        if ln.lower().startswith("content-length")
                    ),
                    0,
                )
                body = await reader.readexactly(length)
                path = head.split(" ")[1]
                if path == "/stats":
                    span = self.last_write - (self.first_arrival or self.last_write)
                    data = json.dumps(
                        {
                            "tokens": self.tokens,
                            "span_s": span,
                            "first": self.first_arrival,
                            "last": self.last_write,
                        }
                    ).encode()
                    self.tokens, self.first_arrival = 0, None
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data))
                    continue
                if path != "/v1/completions":
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    continue
                if self.first_arrival is None:
                    self.first_arrival = time.perf_counter()
                n = json.loads(body)["max_tokens"]
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                done = asyncio.Event()
                self.active[writer] = [n, n, done]
                await done.wait()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def serve(tick_s: float, port_queue: mp.Queue) -> None:
    async def main() -> None:
        srv = BatchServer(tick_s)
        server = await asyncio.start_server(srv.handle, "127.0.0.1", 0, backlog=1024)
        port_queue.put(server.sockets[0].getsockname()[1])
        await srv.ticker()

    asyncio.run(main())


# --- the client ---------------------------------------------------------------------------------


def measure(tick_s: float, concurrency: int, output_len: int) -> dict[str, float]:
    import httpx

    from tools.bench.loadgen import run_sweep
    from tools.config import BenchConfig

    queue: mp.Queue = mp.Queue()
    proc = mp.Process(target=serve, args=(tick_s, queue), daemon=True)
    proc.start()
    try:
        endpoint = f"http://127.0.0.1:{queue.get(timeout=10)}"
        settings = BenchConfig(
            concurrency=[concurrency],
            input_len=16,
            output_len=output_len,
            prompts_per_level=concurrency,
            warmup=0,
        )
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = asyncio.run(run_sweep(endpoint, settings))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        truth = httpx.get(endpoint + "/stats", trust_env=False).json()
    finally:
        proc.kill()
        proc.join()
    lv = result.levels[0]
    true_rate = truth["tokens"] / truth["span_s"]
    return {
        "target": concurrency / tick_s,
        "reported": lv.output_throughput or 0.0,
        "truth": true_rate,
        "diff_pct": ((lv.output_throughput or 0.0) / true_rate - 1) * 100,
        "cpu_ms_per_1k": cpu / max(lv.total_output_tokens, 1) * 1000 * 1000,
        "cpu_util": cpu / wall,
        "itl_ms": lv.mean_itl_ms or 0.0,
        "failed": lv.failed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=800)
    parser.add_argument("--ticks-ms", default="20,10,6,4,3,2")
    args = parser.parse_args()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load}; the server process shares them")
    print(
        f"concurrency {args.concurrency}, {args.output_len} tokens per request, one client process (one core)"
    )
    print(
        f"{'offered tok/s':>13} {'reported':>10} {'server truth':>12} {'diff':>7} {'client CPU':>10} {'CPU ms/1k tok':>13} {'mean ITL':>9}"
    )
    best, cpu_per_1k = 0.0, []
    for tick_ms in [float(t) for t in args.ticks_ms.split(",")]:
        m = measure(tick_ms / 1000, args.concurrency, args.output_len)
        ok = abs(m["diff_pct"]) <= 2.0 and not m["failed"]
        best = max(best, m["reported"]) if ok else best
        cpu_per_1k.append(m["cpu_ms_per_1k"])
        print(
            f"{m['target']:>13,.0f} {m['reported']:>10,.0f} {m['truth']:>12,.0f} {m['diff_pct']:>+6.2f}% "
            f"{m['cpu_util']:>9.0%} {m['cpu_ms_per_1k']:>13.1f} {m['itl_ms']:>7.2f}ms"
            + ("" if ok else "  (client lags)")
        )
    print(f"highest rate reported within 2% of the server's truth: {best:,.0f} tok/s (target >= 20,000)")
    fastest = min(cpu_per_1k)
    print(
        f"client CPU per 1,000 tokens: {fastest:.1f}..{max(cpu_per_1k):.1f} ms -> one dedicated core streams "
        f"~{1e6 / fastest:,.0f} tok/s"
    )


if __name__ == "__main__":
    main()
