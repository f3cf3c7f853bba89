"""Runs the scheduler against the wall clock: sleeps each step's simulated time times the time scale."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

from sim.scheduler import OutOfMemory, Request, Scheduler

MAX_LAG_S = 1.0
"""Wall seconds the loop may run behind its clock and still catch up (by stepping without sleeping)."""
FLUSH_S = 0.01
"""While behind, how often (wall seconds) the loop yields so that streams can write."""


def log(message: str) -> None:
    """A server log line on stderr, in SGLang's format."""
    sys.stderr.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}\n")
    sys.stderr.flush()


class Engine:
    """Owns the scheduler loop; generation handlers `submit` requests and read token counts."""

    def __init__(self, scheduler: Scheduler, *, time_scale: float, on_crash: Callable[[str], None]) -> None:
        self.scheduler, self.time_scale, self.on_crash = scheduler, time_scale, on_crash
        self._queues: dict[Request, asyncio.Queue[int]] = {}
        self._wake = asyncio.Event()
        self._steps = 0
        self._window_tokens = 0
        self._window_start = time.monotonic()
        self.last_gen_throughput = 0.0

    def submit(self, req: Request) -> asyncio.Queue[int]:
        """Queue `req`; its queue receives the number of new tokens after each step that advanced it."""
        queue: asyncio.Queue[int] = asyncio.Queue()
        self._queues[req] = queue
        self.scheduler.add(req)
        self._wake.set()
        return queue

    def abort(self, req: Request) -> None:
        """Forget a request whose client went away."""
        self.scheduler.cancel(req)
        self._queues.pop(req, None)

    async def run(self) -> None:
        """The scheduler loop; returns only by crashing the process through `on_crash`."""
        loop = asyncio.get_running_loop()
        deadline = flushed = loop.time()
        while True:
            if not self.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                deadline = flushed = loop.time()
            try:
                result = self.scheduler.step()
            except OutOfMemory as e:
                self.on_crash(str(e))
                return
            deadline += result.seconds * self.time_scale
            now = loop.time()
            if deadline > now:
                await asyncio.sleep(deadline - now)
                flushed = deadline
            elif now - deadline > MAX_LAG_S:
                deadline = flushed = now  # starved for long: give the time up rather than burst for seconds
                await asyncio.sleep(0)
            elif now - flushed > FLUSH_S:
                # Behind the clock (HTTP writes or another process took the CPU): keep stepping and let the
                # streams send what accumulated every few ms, so simulated time is not lost and the
                # throughput a client measures stays the model's.
                await asyncio.sleep(0)
                flushed = now
            gained = 0
            for req, n in result.tokens:
                gained += n
                queue = self._queues.get(req)
                if queue is not None:
                    queue.put_nowait(n)
                    if req.done:
                        del self._queues[req]
            self._log_step(result.kind, gained)
            if result.kind == "prefill":
                self._log_prefill(result.new_tokens, result.cached_tokens)

    def _log_prefill(self, new_tokens: int, cached_tokens: int) -> None:
        sched = self.scheduler
        used = sum(r.kv_tokens for r in sched.running)
        log(
            f"Prefill batch. #new-token: {new_tokens}, #cached-token: {cached_tokens}, "
            f"token usage: {used / max(sched.capacity, 1):.2f}, #running-req: {len(sched.running)}, "
            f"#queue-req: {len(sched.waiting)}"
        )

    def _log_step(self, kind: str, gained: int) -> None:
        self._window_tokens += gained
        if kind != "decode":
            return
        self._steps += 1
        if self._steps % 40:
            return
        now = time.monotonic()
        sim_seconds = (now - self._window_start) / self.time_scale
        self.last_gen_throughput = self._window_tokens / sim_seconds if sim_seconds > 0 else 0.0
        self._window_tokens, self._window_start = 0, now
        sched = self.scheduler
        used = sum(r.kv_tokens for r in sched.running)
        log(
            f"Decode batch. #running-req: {len(sched.running)}, #token: {used}, "
            f"token usage: {used / max(sched.capacity, 1):.2f}, "
            f"gen throughput (token/s): {self.last_gen_throughput:.2f}, #queue-req: {len(sched.waiting)}"
        )
