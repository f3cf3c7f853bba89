"""optagent's benchmark client beside SGLang's own `bench_serving`, against one fixed-rate SSE server.

A separate server process streams SGLang-shaped `/v1/completions` chunks (~200 bytes, one HTTP chunk
per token, the final `usage` chunk only when `stream_options.include_usage` asks for it, as SGLang)
at a fixed total rate, whatever the number of open streams. Each client runs in its own process at
concurrency c, closed loop (3c requests, a finished one is replaced at once). Per cell it prints:
the client's reported output tok/s over the server's true rate (tokens written / time from the
first request to the last token), the client's CPU seconds per 1,000 tokens inside that window
(from /proc, sampled every 20 ms) until the client has read the last token (its last close of a
streaming connection, when that comes after the last write), the start time (process spawn to the first request at the
server) and the peak RSS.

    python benchmarks/bench_client.py [--levels 16,64,256] [--rates 5000,20000,50000] [--runs 3]
        [--bench-serving PYTHON]  # a venv's python with the sglang 0.5.23 wheel (see below)

bench_serving runs unmodified: `PYTHON -m sglang.bench_serving --backend sglang-oai --dataset-name
random-ids` with a local 1,000-word tokenizer (written by this script; no download). Its venv: the
sglang 0.5.23 wheel with --no-deps, plus torch and torchvision (its import of
`sglang.srt.disaggregation.utils` loads them), triton, transformers, aiohttp, msgspec, numpy,
orjson, requests, tqdm, psutil, pyzmq, pybase64, pillow, IPython, starlette, datasets,
sentencepiece, compressed-tensors, loguru, gguf, apache-tvm-ffi. Without it, optagent's client runs
alone. Target: optagent's CPU per token <= bench_serving's in every cell, accuracy >= 0.95.

Measured here (2 shared cores, load average 1-11 from other sessions; 3 runs per cell, ranges), CPU
s per 1k tokens optagent / bench_serving: c=16: 0.014-0.018 / 0.026-0.035 at 5k tok/s,
0.007-0.009 / 0.020-0.021 at 20k, 0.005-0.006 / 0.011-0.012 at 50k; c=64: 0.013-0.018 /
0.029-0.038, 0.011-0.014 / 0.023-0.024, 0.009-0.011 / 0.013-0.018; c=256: 0.018-0.021 /
0.050-0.056, 0.010-0.014 / 0.017-0.030, 0.003-0.012 / 0.011-0.021. Accuracy 0.979-1.000 /
0.856-0.998; start 0.35-1.99 s / 53.3-69.2 s (bench_serving imports torch); peak RSS 51-71 MB /
1002-1058 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TICK = os.sysconf("SC_CLK_TCK")
DEFAULT_VENV_PYTHON = "/work/scratch/bench-serving-venv/bin/python"

# --- the server (its own process) ---------------------------------------------------------------


class FixedRateServer:
    """Writes `rate` tokens per second in total, spread evenly over the open streams."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.active: dict[asyncio.StreamWriter, list] = {}
        self.tokens, self.first, self.last, self.closed = 0, 0.0, 0.0, 0.0

    async def ticker(self) -> None:
        credit, prev = 0.0, time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            if not self.active:
                credit, prev = 0.0, now
                continue
            credit += (now - prev) * self.rate / len(self.active)  # tokens due per stream
            prev = now
            due = int(credit)
            if not due:
                continue
            credit -= due
            for writer, st in list(self.active.items()):
                n = min(due, st[0])
                st[0] -= n
                out = [st[2]] * (n if st[0] else n - 1)
                if not st[0]:
                    out.append(st[3])
                frames = b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in out)
                writer.write(frames + (st[4] if not st[0] else b""))
                self.tokens += n
                if not st[0]:
                    del self.active[writer]
                    st[5].set()
            self.last = time.perf_counter()

    @staticmethod
    def _chunks(n: int, rid: str, usage: bool) -> tuple[bytes, bytes, bytes]:
        def event(finish: str | None) -> bytes:
            choice = {
                "index": 0,
                "text": " tok",
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }
            body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": "m",
                    "choices": [choice], "usage": None}  # fmt: skip
            return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

        tail = b""
        if usage:
            u = {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n}
            tail = b"data: " + json.dumps({"id": rid, "choices": [], "usage": u}).encode() + b"\n\n"
        tail += b"data: [DONE]\n\n"
        return event(None), event("length") + tail, b"0\r\n\r\n"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        streamed = False
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                length = next((int(ln.split(":")[1]) for ln in head.split("\r\n")
                               if ln.lower().startswith("content-length")), 0)  # fmt: skip
                body = await reader.readexactly(length)
                path = head.split(" ")[1]
                if path == "/v1/completions":
                    streamed = True
                    if not self.first:
                        self.first = time.perf_counter()
                    req = json.loads(body)
                    usage = bool((req.get("stream_options") or {}).get("include_usage"))
                    n = int(req["max_tokens"])
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                 b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
                    done = asyncio.Event()
                    self.active[writer] = [
                        n,
                        n,
                        *self._chunks(n, f"cmpl-{os.urandom(16).hex()}", usage),
                        done,
                    ]
                    await done.wait()
                    continue
                if path == "/stats":
                    stats = {
                        "tokens": self.tokens,
                        "first": self.first,
                        "last": self.last,
                        "closed": self.closed,
                    }
                    data = json.dumps(stats).encode()
                    self.tokens, self.first = 0, 0.0
                elif path in ("/health", "/v1/models"):
                    data = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    continue
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(data), data))  # fmt: skip
        except (asyncio.IncompleteReadError, ConnectionError):
            if streamed:  # the client has read every byte sent on this connection before closing it
                self.closed = time.perf_counter()
            writer.close()


def serve(rate: float, port_queue: mp.Queue) -> None:
    async def main() -> None:
        srv = FixedRateServer(rate)
        server = await asyncio.start_server(srv.handle, "127.0.0.1", 0, backlog=1024)
        port_queue.put(server.sockets[0].getsockname()[1])
        await srv.ticker()

    asyncio.run(main())


# --- the clients (each in its own process) --------------------------------------------------------


def run_ours(endpoint: str, concurrency: int, prompts: int, output_len: int) -> None:
    """Entry point of the child process that runs optagent's client; prints its figures as JSON."""
    from tools.bench.loadgen import run_sweep
    from tools.config import BenchConfig

    settings = BenchConfig(concurrency=[concurrency], input_len=16, output_len=output_len,
                           prompts_per_level=prompts, warmup=0)  # fmt: skip
    lv = asyncio.run(run_sweep(endpoint, settings)).levels[0]
    print(json.dumps({"reported": lv.output_throughput, "failed": lv.failed}))


def write_tokenizer(python: str, folder: Path) -> None:
    """A 1,000-word WordLevel tokenizer bench_serving can load with AutoTokenizer (no download)."""
    code = (
        "import json,sys\nfrom tokenizers import Tokenizer,models,pre_tokenizers,decoders\n"
        "v={'[UNK]':0,**{f'w{i}':i+1 for i in range(999)}}\n"
        "t=Tokenizer(models.WordLevel(v,unk_token='[UNK]'));t.pre_tokenizer=pre_tokenizers.WhitespaceSplit()\n"
        "t.decoder=decoders.WordPiece();t.save(sys.argv[1]+'/tokenizer.json')\n"
        "json.dump({'tokenizer_class':'PreTrainedTokenizerFast','unk_token':'[UNK]'},"
        "open(sys.argv[1]+'/tokenizer_config.json','w'))\n"
    )
    subprocess.run([python, "-c", code, str(folder)], check=True)


def client_argv(
    kind: str, endpoint: str, c: int, prompts: int, out_len: int, tmp: Path, python: str
) -> list[str]:
    if kind == "optagent":
        return [sys.executable, __file__, "--run-ours", endpoint, str(c), str(prompts), str(out_len)]
    return [python, "-m", "sglang.bench_serving", "--backend", "sglang-oai", "--base-url", endpoint,
            "--model", "m", "--tokenizer", str(tmp), "--dataset-name", "random-ids",
            "--random-input-len", "16", "--random-output-len", str(out_len), "--random-range-ratio", "1",
            "--num-prompts", str(prompts), "--max-concurrency", str(c), "--request-rate", "inf",
            "--warmup-requests", "0", "--disable-tqdm", "--output-file", str(tmp / "out.jsonl")]  # fmt: skip


class Sampler(threading.Thread):
    """(perf_counter, CPU seconds, RSS bytes) of a process every 20 ms, from /proc."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.samples, self.stop = pid, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                stat = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
                rss = int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
                self.samples.append((time.perf_counter(), (int(stat[11]) + int(stat[12])) / TICK, rss))
            except (OSError, IndexError):
                return
            time.sleep(0.02)

    def cpu_at(self, t: float) -> float:
        before = [s for s in self.samples if s[0] <= t] or self.samples[:1]
        after = [s for s in self.samples if s[0] >= t] or self.samples[-1:]
        (t0, c0, _), (t1, c1, _) = before[-1], after[0]
        return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def measure(kind: str, rate: float, c: int, python: str, tmp: Path) -> dict[str, float]:
    queue: mp.Queue = mp.Queue()
    server = mp.Process(target=serve, args=(rate, queue), daemon=True)
    server.start()
    prompts = 3 * c
    out_len = max(32, min(4000, int(rate * 6 / prompts)))  # ~6 s of streaming
    try:
        endpoint = f"http://127.0.0.1:{queue.get(timeout=10)}"
        spawned = time.perf_counter()
        proc = subprocess.Popen(client_argv(kind, endpoint, c, prompts, out_len, tmp, python),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        sampler = Sampler(proc.pid)
        sampler.start()
        out, err = proc.communicate(timeout=600)
        sampler.stop.set()
        import httpx

        truth = httpx.get(endpoint + "/stats", trust_env=False).json()
    finally:
        server.kill()
        server.join()
    if proc.returncode:
        raise RuntimeError(f"{kind} failed: {err[-2000:]}")
    if kind == "optagent":
        reported = json.loads(out.strip().splitlines()[-1])["reported"]
    else:
        reported = json.loads((tmp / "out.jsonl").read_text().strip().splitlines()[-1])["output_throughput"]
    span = truth["last"] - truth["first"]
    # CPU until the client has read the last token (a client that lags reads after the last write):
    # the last close of a streaming connection, or the last write when connections stay open.
    end = max(truth["last"], truth["closed"])
    cpu = sampler.cpu_at(end) - sampler.cpu_at(truth["first"])
    return {
        "accuracy": reported / (truth["tokens"] / span),
        "truth": truth["tokens"] / span,
        "cpu_per_1k": cpu / truth["tokens"] * 1000,
        "start_s": truth["first"] - spawned,
        "rss_mb": max(s[2] for s in sampler.samples) / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="16,64,256")
    parser.add_argument("--rates", default="5000,20000,50000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", default="optagent,bench_serving")
    parser.add_argument("--bench-serving", default=DEFAULT_VENV_PYTHON, help="python of a venv with sglang")
    parser.add_argument("--run-ours", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_ours:
        endpoint, c, prompts, out_len = args.run_ours
        run_ours(endpoint, int(c), int(prompts), int(out_len))
        return
    kinds = [k for k in args.clients.split(",") if k == "optagent" or Path(args.bench_serving).exists()]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load}; server and client share them")
    print(f"{'c':>4} {'rate':>6} | " + " | ".join(f"{k:^40}" for k in kinds))
    print(
        f"{'':>4} {'':>6} | "
        + " | ".join(f"{'accuracy':>9} {'CPU s/1k':>9} {'start s':>8} {'RSS MB':>8}" for _ in kinds)
    )
    with tempfile.TemporaryDirectory() as tmp:
        if "bench_serving" in kinds:
            write_tokenizer(args.bench_serving, Path(tmp))
        for c in map(int, args.levels.split(",")):
            for rate in map(float, args.rates.split(",")):
                cells = []
                for kind in kinds:
                    runs = [measure(kind, rate, c, args.bench_serving, Path(tmp)) for _ in range(args.runs)]
                    cells.append(
                        f"{_span(runs, 'accuracy', '.3f'):>9} {_span(runs, 'cpu_per_1k', '.3f'):>9} "
                        f"{_span(runs, 'start_s', '.2f'):>8} {_span(runs, 'rss_mb', '.0f'):>8}"
                    )
                print(f"{c:>4} {rate / 1000:>5.1f}k | " + " | ".join(cells), flush=True)


def _span(runs: list[dict[str, float]], key: str, fmt: str) -> str:
    lo, hi = min(r[key] for r in runs), max(r[key] for r in runs)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}-{hi:{fmt}}"


if __name__ == "__main__":
    main()
