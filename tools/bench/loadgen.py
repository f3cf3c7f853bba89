"""Closed-loop (or Poisson-rate) sweeps over concurrency levels against one endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import math
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tools.bench.goodput import GOODPUT_PROMPTS, GOODPUT_SPANS, Measure, find_goodput
from tools.bench.multiturn import conversations
from tools.bench.netstream import ClientPool
from tools.bench.objective import Slo
from tools.bench.prompts import Prompt, load_prompt_file
from tools.bench.results import LevelResult, RequestResult, SweepResult, summarize_level
from tools.bench.streaming import API_PATHS, TokenCounter, build_payload, send_request
from tools.bench.workload import level_prompts
from tools.config import BenchConfig
from tools.redact import redact, redact_text


@dataclass(frozen=True, slots=True)
class Progress:
    """A snapshot of a running level, for live display."""

    concurrency: int
    done: int
    total: int
    output_tokens: int
    elapsed_s: float
    rep: int = 0
    reps: int = 1
    finished: bool = False

    @property
    def tokens_per_s(self) -> float:
        """Output tokens streamed per second so far in this level."""
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


ProgressFn = Callable[[Progress], None]


async def fetch_server_info(client: httpx.AsyncClient, endpoint: str) -> dict[str, Any] | None:
    """SGLang's `/get_server_info` (or `/server_info`); None when the server has neither.

    Raises `httpx.HTTPError` when the endpoint cannot be reached at all.
    """
    for path in ("/get_server_info", "/server_info"):
        resp = await client.get(endpoint + path, timeout=10.0)
        if resp.status_code == 200:
            try:
                info = resp.json()
            except ValueError:
                return None
            return redact(info) if isinstance(info, dict) else None
    return None


def speculative(server_info: dict[str, Any] | None) -> bool:
    """The server decodes speculatively (its resolved `speculative_algorithm` is set)."""
    return bool((server_info or {}).get("speculative_algorithm"))


async def accept_length(client: httpx.AsyncClient, endpoint: str) -> float | None:
    """SGLang's `avg_spec_accept_length` now (its first scheduler's, as `bench_serving` reads it);
    None when the server does not say or cannot be asked."""
    try:
        info = await fetch_server_info(client, endpoint)
    except httpx.HTTPError:
        return None
    states = (info or {}).get("internal_states") or [{}]
    value = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


async def flush_cache(client: httpx.AsyncClient, endpoint: str, *, timeout: float = 10.0) -> bool:
    """Empty the server's prefix cache before a level (SGLang's `/flush_cache`, as bench_serving
    does after its warm-up): what an earlier level or sweep of this launch left in the cache must
    not make this one faster. False when the server has no such route or refused."""
    try:
        resp = await client.post(endpoint + "/flush_cache", timeout=timeout)
    except httpx.HTTPError:
        return False
    return resp.status_code == 200


def _model_name(info: dict[str, Any] | None) -> str:
    info = info or {}
    name = info.get("served_model_name") or info.get("model_path")
    return name if isinstance(name, str) and name else "default"


@contextlib.contextmanager
def _collector_paused():  # type: ignore[no-untyped-def]
    """No cyclic garbage collection while a level is timed. In a process that holds a large heap (the
    agent's, after research) one full collection stops the event loop for 0.2-0.6 s: inside a 4 s
    level that is a 5-15% dip in the measured throughput that the server never had. The level's own
    garbage is freed by reference counting; the collector runs again between levels."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


STALLED = "timed out"
"""How a request that got no byte for `stall_timeout_s`, or ran over `request_timeout_s`, fails."""


@dataclass(frozen=True, slots=True)
class _Body:
    """One request ready to send: its encoded payload, prompt length and turn (None: alone)."""

    data: bytes
    input_len: int
    turn: int | None = None


async def _run_level(
    pool: ClientPool,
    path: str,
    api: str,
    chains: list[list[_Body]],
    *,
    concurrency: int,
    request_rate: float | None,
    seed: int,
    progress: Callable[[int, int, float, bool], None] | None,
    time_scale: float = 1.0,
) -> tuple[list[RequestResult], float]:
    """Send every body with at most `concurrency` in flight; returns results and the duration. A
    chain is a conversation: its next turn is sent once the turn before it was answered, behind the
    requests already waiting for a slot (a prompt alone is a chain of one). A request that times out
    (`STALLED`) stops the level: what is in flight is cancelled and the rest is not sent (a server
    that stopped answering would keep every one of them waiting as long). One piece because the
    nested `one`, `conversation` and `ticker` share the slots, results, token counter and task list:
    a stalled request cancels its siblings through that list."""
    counter = TokenCounter()
    results: list[RequestResult] = []
    slots: asyncio.Queue[int] = asyncio.Queue()
    for i in range(concurrency):
        slots.put_nowait(i)
    t0 = time.perf_counter()
    tasks: list[asyncio.Task[None]] = []

    async def one(body: _Body) -> bool:
        slot = await slots.get()
        try:
            r = await send_request(
                pool[slot],
                path,
                api,
                body.data,
                input_len=body.input_len,
                timeout=pool.stall_s,
                whole=pool.timeout_s,
                counter=counter,
                t0=t0,
            )
            r.turn = body.turn
            results.append(r)
        finally:
            slots.put_nowait(slot)
        if not r.ok and (r.error or "").startswith(STALLED):
            for task in tasks:
                if task is not asyncio.current_task():
                    task.cancel()
            return False
        return True

    async def conversation(chain: list[_Body]) -> None:
        for body in chain:
            if not await one(body):
                return

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0.25)
            progress(len(results), counter.n, (time.perf_counter() - t0) / time_scale, False)

    tick = asyncio.create_task(ticker()) if progress else None
    try:
        rng = random.Random(seed)
        for chain in chains:  # a rate spaces the conversations' first turns
            if any(t.cancelled() for t in tasks):  # a request stalled: nothing more is sent
                break
            tasks.append(asyncio.create_task(conversation(chain)))
            if request_rate is not None:
                await asyncio.sleep(
                    rng.expovariate(request_rate) * time_scale
                )  # a rate on the server's clock
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        for outcome in outcomes:  # a bug inside a request is raised, a cancelled one was stopped
            if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
                raise outcome
    finally:
        if tick:
            tick.cancel()
    duration = time.perf_counter() - t0
    if progress:  # the final figure uses the table's tokens and duration, so the two agree
        progress(len(results), sum(r.output_tokens for r in results if r.ok), duration / time_scale, True)
    return results, duration


def _encode(api: str, prompts: list[Prompt], model: str) -> list[list[_Body]]:
    """The level's requests as the chains they are sent in (`tools.bench.multiturn.conversations`)."""
    return [
        [_Body(json.dumps(build_payload(api, p, model=model)).encode(), p.input_len, p.turn) for p in chain]
        for chain in conversations(prompts, lambda p: p.conversation)
    ]


def _is_unreachable(results: list[RequestResult]) -> bool:
    return any(r.error and r.error.startswith(("cannot connect", "connection lost")) for r in results)


async def run_sweep(
    endpoint: str,
    settings: BenchConfig,
    *,
    on_progress: ProgressFn | None = None,
    seed: int = 0,
    request_rate: float | None = None,
    prompt_file: Path | None = None,
    model: str | None = None,
    rep: int = 0,
    reps: int = 1,
    start_rate: float | None = None,
) -> SweepResult:
    """One sweep over `settings.concurrency` against `endpoint` (`http://host:port`); with
    `settings.goodput_limits`, a goodput search (`goodput_sweep`, from `start_rate`: see
    `goodput_hint`).

    Warm-up requests go first and are not counted. Failed requests are recorded with their cause
    and make the result `partial`; if the server becomes unreachable the remaining levels are
    skipped and named in `errors`. Never raises for a server problem.

    One piece because the result is built, filled inside one client pool and redacted in one place,
    so no unredacted URL leaves it; a third of its length is this docstring and the signature.
    """
    endpoint = endpoint.rstrip("/")
    if settings.goodput_limits:
        return await goodput_sweep(endpoint, settings, seed=seed, on_progress=on_progress, start=start_rate)
    path = API_PATHS[settings.api]
    file_prompts = load_prompt_file(prompt_file, output_len=settings.output_len) if prompt_file else None
    result = SweepResult(
        endpoint=endpoint,
        api=settings.api,
        settings={
            **settings.model_dump(mode="json"),
            "request_rate": request_rate,
            "prompt_file": str(prompt_file) if prompt_file else None,
        },
        client_host=socket.gethostname(),
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        seed=seed,
    )
    async with ClientPool(
        endpoint, max(settings.concurrency), settings.request_timeout_s, stall_s=settings.stall_timeout_s
    ) as pool:
        try:
            result.server_info = await fetch_server_info(pool.client, endpoint)
        except httpx.HTTPError as e:
            result.errors.append(f"cannot reach {endpoint}: {str(e) or type(e).__name__}")
        if not result.errors:
            await _sweep_levels(
                pool, path, settings, result, file_prompts, model, request_rate, on_progress, rep, reps
            )
    missing = [c for c in settings.concurrency if result.level(c) is None]
    if missing:
        result.errors.append(f"levels not measured: {', '.join(map(str, missing))}")
    result.partial = bool(result.errors) or any(not lv.ok for lv in result.levels)
    result.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
    result.endpoint = redact_text(endpoint)  # saved and printed: never a URL's password
    result.errors = [redact_text(e) for e in result.errors]
    for level in result.levels:  # a failed request's cause may name the URL
        causes: dict[str, int] = {}
        for cause, n in level.errors.items():
            causes[redact_text(cause)] = causes.get(redact_text(cause), 0) + n
        level.errors = causes
    return result


async def _warm_up(
    pool: ClientPool,
    path: str,
    settings: BenchConfig,
    result: SweepResult,
    file_prompts: list[Prompt] | None,
    model: str,
) -> bool:
    """Send `settings.warmup` prompts at once, not measured; False (with the error recorded) when the
    server cannot be reached."""
    warm = level_prompts(settings, 0, result.seed + 500_000, file_prompts)[: settings.warmup]
    res, _ = await _run_level(
        pool, path, settings.api, _encode(settings.api, warm, model), concurrency=len(warm),
        request_rate=None, seed=result.seed, progress=None,
    )  # fmt: skip
    if _is_unreachable(res):
        result.errors.append(f"warm-up failed: {res[0].error}")
        return False
    return True


async def _sweep_levels(
    pool: ClientPool,
    path: str,
    settings: BenchConfig,
    result: SweepResult,
    file_prompts: list[Prompt] | None,
    model: str | None,
    request_rate: float | None,
    on_progress: ProgressFn | None,
    rep: int,
    reps: int,
) -> None:
    """One sweep: the warm-up, then each concurrency level in order, stopping at the first level
    where a request stalled or the server became unreachable (the error says which)."""
    api, seed = settings.api, result.seed
    model = model or _model_name(result.server_info)
    if settings.warmup and not await _warm_up(pool, path, settings, result, file_prompts, model):
        return
    for c in settings.concurrency:
        chains = _encode(api, level_prompts(settings, c, seed, file_prompts), model)
        await pool.preconnect(c)
        if result.server_info is not None:  # an SGLang server (others may not take the POST lightly)
            await flush_cache(pool.client, result.endpoint, timeout=min(10.0, settings.request_timeout_s))
        progress = None
        if on_progress:
            total = sum(map(len, chains))

            def progress(done: int, toks: int, el: float, fin: bool, c: int = c, total: int = total) -> None:
                on_progress(Progress(c, done, total, toks, el, rep, reps, fin))

        with _collector_paused():
            res, duration = await _run_level(
                pool, path, api, chains, concurrency=c, request_rate=request_rate, seed=seed + c,
                progress=progress, time_scale=settings.time_scale,
            )  # fmt: skip
        res = sorted((r.on_clock(settings.time_scale) for r in res), key=lambda r: r.start_s)
        duration /= settings.time_scale  # in the server's seconds (the simulator's clock may run fast)
        level = summarize_level(res, max_concurrency=c, duration=duration, request_rate=request_rate)
        if speculative(result.server_info):
            level.accept_length = await accept_length(pool.client, result.endpoint)
        result.levels.append(level)
        if stalled := next((r.error for r in res if (r.error or "").startswith(STALLED)), None):
            result.errors.append(
                f"a request stalled at concurrency {c} ({stalled}): the rest of the sweep was not sent"
            )
            return
        if _is_unreachable(res):
            cause = next(r.error for r in res if r.error)
            result.errors.append(f"server unreachable at concurrency {c}: {cause}")
            return


async def run_repeated(
    endpoint: str,
    settings: BenchConfig,
    *,
    reps: int | None = None,
    on_progress: ProgressFn | None = None,
    before_rep: Callable[[list[SweepResult]], None] | None = None,
    **sweep_kwargs: Any,
) -> list[SweepResult]:
    """`reps` (default `settings.reps`) sweeps with seeds 0..reps-1; stops after a partial sweep,
    whose numbers cannot be trusted, so the last element tells why. `before_rep` is called with the
    sweeps done before each one starts, the first included: what it raises stops the benchmark
    there (between sweeps, the safe points of a wall-time budget)."""
    reps = reps or settings.reps
    sweeps: list[SweepResult] = []
    for rep in range(reps):
        if before_rep is not None:
            before_rep(sweeps)
        sweep = await run_sweep(
            endpoint, settings, on_progress=on_progress, seed=rep, rep=rep, reps=reps,
            start_rate=goodput_hint(sweeps), **sweep_kwargs,
        )  # fmt: skip
        sweeps.append(sweep)
        if sweep.partial:
            break
    return sweeps


def rate_runs(
    endpoint: str, settings: BenchConfig, *, prompts: int = GOODPUT_PROMPTS, seed: int = 0,
    on_progress: ProgressFn | None = None,
) -> Measure:  # fmt: skip
    """`Measure` over `endpoint`: each run sends at least `prompts` requests of the configured
    workload (the same prompts and arrival pattern, scaled, at every rate), none held back by the
    client (as `bench_serving` without `--max-concurrency`: a queue builds at the server, where it
    counts); the warm-up goes before the first run only. None: all of them at once (closed loop).

    A run must outlast its requests' latency, or a server that holds the whole run in flight at
    once answers any rate: at a rate, a run sends enough requests for its arrivals to span
    `GOODPUT_SPANS` median end-to-end latencies of the run before it (at most 10 x `prompts`)."""
    runs: list[LevelResult] = []

    def as_search(p: Progress) -> None:  # shown under the search's level, whatever a run's size
        if on_progress is not None:
            on_progress(dataclasses.replace(p, concurrency=prompts))

    async def measure(rate: float | None) -> LevelResult:
        e2e = runs[-1].median_e2e_latency_ms if runs else None
        n = prompts
        if rate is not None and e2e:
            n = min(10 * prompts, max(prompts, math.ceil(rate * GOODPUT_SPANS * e2e / 1000.0)))
        update = {"concurrency": [n], "prompts_per_level": n, "goodput_limits": {}}
        one = settings.model_copy(update={**update, "warmup": 0 if runs else settings.warmup})
        sweep = await run_sweep(endpoint, one, request_rate=rate, seed=seed, on_progress=as_search)
        level = sweep.levels[0] if sweep.levels else LevelResult(  # nothing measured: all failed, with why
            max_concurrency=n, request_rate=rate, num_prompts=n, failed=n,
            errors={e: n for e in sweep.errors[:1]} or {"nothing measured": n},
        )  # fmt: skip
        runs.append(level)
        return level

    return measure


def goodput_hint(sweeps: list[SweepResult]) -> float | None:
    """Where the next goodput search of the same configuration starts: the first goodput found
    among `sweeps` (None: search from scratch)."""
    return next((lv.goodput for s in sweeps for lv in s.levels if lv.goodput), None)


async def goodput_sweep(
    endpoint: str,
    settings: BenchConfig,
    *,
    seed: int = 0,
    on_progress: ProgressFn | None = None,
    start: float | None = None,
) -> SweepResult:
    """One repetition of a goodput objective: a search (`tools.bench.goodput.find_goodput`) under
    `settings.goodput_limits`, as a sweep of one level at `settings.concurrency[0]` requests per run:
    the run at the highest rate that held, with `goodput` its estimate; every run in `rate_curve`.
    No rate holding leaves the level out (the sweep is partial, with why)."""
    prompts = settings.concurrency[0]
    limits = [Slo(metric=k, max_ms=v) for k, v in settings.goodput_limits.items()]
    measure = rate_runs(endpoint, settings, prompts=prompts, seed=seed, on_progress=on_progress)
    curve = await find_goodput(measure, limits, start=start)
    runs = [*([curve.closed] if curve.closed else []), *(p.level for p in curve.points)]
    runs = [
        run.model_copy(update={"requests": []}) for run in runs
    ]  # the summaries: the best run keeps its own
    result = SweepResult(
        endpoint=redact_text(endpoint), api=settings.api, settings=settings.model_dump(mode="json"),
        client_host=socket.gethostname(), seed=seed, rate_curve=runs,
    )  # fmt: skip
    best = next((p.level for p in curve.points if p.rate == curve.goodput), None)
    if best is None:
        result.errors.append(curve.describe())
    else:
        result.levels.append(best.model_copy(update={"max_concurrency": prompts, "goodput": curve.estimate}))
    result.partial = best is None
    return result
