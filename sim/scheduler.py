"""Continuous batching in simulated time: admission, chunked prefill, decode steps, KV accounting.

Pure logic with no clock: `step()` returns how long the iteration takes and which requests gained
tokens; `sim.engine` sleeps that long (times the time scale) and delivers the tokens.

The radix cache: SGLang keeps the KV of every finished prefill in a radix tree (unless
`--disable-radix-cache`), so a request that starts with the same tokens as an earlier one (a shared
system prompt) prefills only the rest. Here a prompt is a chain of 16-token blocks, each block's
key hashing all tokens up to its end, and the cache an LRU set of those keys holding at most the
KV pool's tokens (shared blocks are not deducted from the pool). Random prompts share no block.

The queue's order: first come, first served (SGLang's default `fcfs`), or with `--schedule-policy
lpm` SGLang's longest-prefix-match (0.5.23 managers/schedule_policy.py `calc_priority`): while at
most 128 wait (`WAITING_QUEUE_PREFIX_MATCH_MAX`; more: fcfs), the queue is sorted by cached
prefix, longest first, after holding back every request whose prompt shares 32 tokens or more with
an earlier waiting one that the cache does not hold yet (in-batch prefix caching, :346-396): one
prefills the shared prefix, the others then find it cached instead of prefilling it again.
"""

from __future__ import annotations

import math
import random
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sim.perf import PerfModel
from sim.plan import Plan
from sim.text import count_prompt_tokens, prompt_tokens

BLOCK = 16
LPM_QUEUE_MAX = 128  # WAITING_QUEUE_PREFIX_MATCH_MAX
IN_BATCH_TOKENS = 32  # IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD and _DEPRIORITIZE_THRESHOLD


def prefix_blocks(prompt: Any) -> tuple[int, ...]:
    """The chained keys of the prompt's whole 16-token blocks (token ids, or words for text)."""
    tokens = prompt_tokens(prompt)
    keys, key = [], 0
    for i in range(0, len(tokens) - BLOCK + 1, BLOCK):
        key = hash((key, *tokens[i : i + BLOCK]))
        keys.append(key)
    return tuple(keys)


class PrefixCache:
    """An LRU set of cached prefix blocks, at most `capacity_tokens` worth."""

    def __init__(self, capacity_tokens: int) -> None:
        self.max_blocks = max(1, capacity_tokens // BLOCK)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def match(self, blocks: tuple[int, ...]) -> int:
        """Tokens of the longest cached prefix of `blocks` (each hit becomes most recently used)."""
        n = 0
        for key in blocks:
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            n += 1
        return n * BLOCK

    def insert(self, blocks: tuple[int, ...]) -> None:
        """Keep a prefilled prompt's blocks, evicting the least recently used beyond capacity."""
        for key in blocks:
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        """`/flush_cache`."""
        self._blocks.clear()

    def __len__(self) -> int:
        return len(self._blocks) * BLOCK


class OutOfMemory(Exception):
    """A forward pass needed more activation memory than `--mem-fraction-static` left free."""


@dataclass(eq=False)
class Request:
    """One generation request as the scheduler sees it."""

    prompt_len: int
    max_new: int
    stop_at: int
    """Tokens after which the request finishes (== max_new with ignore_eos)."""
    prefix: tuple[int, ...] = ()
    """The prompt's prefix blocks (`prefix_blocks`); empty: nothing to share."""
    prefilled: int = 0
    generated: int = 0
    cached: int = 0
    """Prompt tokens the last admission found in the prefix cache (not prefilled again)."""
    draws: random.Random | None = None
    """The request's own draws of how many speculative tokens are accepted, seeded by its prompt:
    greedy decoding of one prompt writes the same output on every launch, so the draft model agrees
    with it at the same places (None: the scheduler's draws)."""
    to_prefill: int = field(init=False)

    def __post_init__(self) -> None:
        self.to_prefill = self.prompt_len

    @classmethod
    def for_prompt(cls, prompt: Any, *, max_new: int, stop_at: int) -> Request:
        """The request a prompt (token ids or text) makes, as the server admits it: its length and
        its prefix blocks, which the radix cache matches (the served API and `sim.offline` both)."""
        tokens = prompt_tokens(prompt)
        return cls(
            prompt_len=count_prompt_tokens(prompt),
            max_new=max_new,
            stop_at=stop_at,
            prefix=prefix_blocks(tokens),
            draws=random.Random(zlib.crc32(repr(tokens).encode())),
        )

    @property
    def done(self) -> bool:
        return self.generated >= self.stop_at

    @property
    def kv_tokens(self) -> int:
        return self.prefilled + self.generated


@dataclass
class StepResult:
    seconds: float
    tokens: list[tuple[Request, int]]
    """Requests that gained tokens in this step and how many."""
    kind: str
    new_tokens: int = 0
    """Prompt tokens a prefill step computed."""
    cached_tokens: int = 0
    """Prompt tokens a prefill step found in the prefix cache instead."""


class Scheduler:
    """SGLang-like scheduler: prefill new requests when they fit, otherwise decode the running batch."""

    def __init__(
        self,
        perf: PerfModel,
        plan: Plan,
        *,
        seed: int | None = None,
        run_factor: float = 1.0,
        step_sigma: float = 0.0,
    ) -> None:
        self.perf, self.plan = perf, plan
        self.capacity = perf.kv_capacity_tokens()
        self.max_running = plan.max_running or perf.max_running_default()
        self.cache = PrefixCache(self.capacity) if plan.radix_cache else None
        self._matched = 0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.rng = random.Random(seed)
        self.run_factor, self.step_sigma = run_factor, step_sigma
        self.spec_tokens = self.spec_forwards = 0
        """Tokens generated and requests verified by speculative steps since start or the last
        `/flush_cache` (SGLang's metrics reporter: its `avg_spec_accept_length` is their ratio)."""

    @property
    def accept_length(self) -> float | None:
        """SGLang's `avg_spec_accept_length`: tokens per request per verify step, the bonus token
        included (1 to steps + 1); None before a speculative step."""
        return self.spec_tokens / self.spec_forwards if self.spec_forwards else None

    def add(self, req: Request) -> None:
        """Queue a request."""
        self.waiting.append(req)

    def cancel(self, req: Request) -> None:
        """Drop a request (client went away)."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _reserved(self) -> float:
        ratio = min(1.0, 0.3 * self.plan.conservativeness)
        return sum(r.kv_tokens + (r.stop_at - r.generated) * ratio for r in self.running)

    def _jitter(self, seconds: float) -> float:
        noise = math.exp(self.rng.gauss(0.0, self.step_sigma)) if self.step_sigma else 1.0
        return seconds * self.run_factor * noise

    def _check_memory(self, tokens: int) -> None:
        if tokens > self.plan.activation_headroom_tokens:
            raise OutOfMemory(
                f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate activations for {tokens} "
                f"tokens; only room for {self.plan.activation_headroom_tokens} is left outside "
                f"--mem-fraction-static {self.plan.mem_fraction_static}."
            )

    def _order_queue(self) -> None:
        """SGLang's `lpm` order of the waiting queue (see the module doc); fcfs leaves it as it is."""
        if self.plan.schedule_policy != "lpm" or self.cache is None or len(self.waiting) > LPM_QUEUE_MAX:
            return
        seen: set[int] = set()  # the waiting queue's own prefix tree, as block keys
        held: set[int] = set()
        matched: dict[int, int] = {}
        for req in self.waiting:
            matched[id(req)] = self.cache.match(req.prefix) if req.prefix else 0
            if matched[id(req)] > IN_BATCH_TOKENS or not req.prefix:
                continue
            shared = next((i for i, key in enumerate(req.prefix) if key not in seen), len(req.prefix))
            if shared * BLOCK >= IN_BATCH_TOKENS:
                held.add(id(req))
            else:
                seen.update(req.prefix)
        # a request part-way through a chunked prefill stays first (SGLang keeps it out of the queue)
        order = sorted(self.waiting, key=lambda r: (r.prefilled == 0, id(r) in held, -matched[id(r)]))
        self.waiting = deque(order)

    def _prefill_batch(self) -> list[tuple[Request, int]]:
        self._order_queue()
        budget, batch = self.plan.chunked_prefill, []
        self._matched = 0
        reserved = self._reserved()
        ratio = min(1.0, 0.3 * self.plan.conservativeness)
        for req in list(self.waiting):
            if len(self.running) + len(batch) >= self.max_running or budget <= 0:
                break
            need = req.to_prefill + (req.stop_at - req.generated) * ratio
            if req.prefilled == 0 and reserved + need > self.capacity:
                break
            if req.prefilled == 0 and self.cache is not None and req.prefix:
                # At least one token is computed, as SGLang does for a fully cached prompt.
                req.cached = min(self.cache.match(req.prefix), req.to_prefill - 1)
                req.prefilled = req.cached
                self._matched += req.cached
            take = min(req.to_prefill - req.prefilled, budget)
            batch.append((req, take))
            budget -= take
            reserved += need
        return batch

    def step(self) -> StepResult:
        """Run one scheduler iteration; raises `OutOfMemory` when activations do not fit."""
        batch = self._prefill_batch()
        decoding = [r for r in self.running if not r.done]
        if batch:
            new_tokens = sum(t for _, t in batch)
            mixed = self.plan.mixed_chunk and decoding
            self._check_memory(new_tokens + (len(decoding) if mixed else 0))
            ctx = sum(r.prefilled + t for r, t in batch)
            secs = self.perf.prefill_s(
                new_tokens, len(batch), ctx, decode_batch=len(decoding) if mixed else 0
            )
            out: list[tuple[Request, int]] = []
            for req, take in batch:
                req.prefilled += take
                if req.prefilled >= req.to_prefill:
                    self.waiting.remove(req)
                    if self.cache is not None and req.prefix:
                        self.cache.insert(req.prefix)
                    req.prefilled = req.prompt_len
                    self.running.append(req)
                    if req.generated == 0:
                        req.generated = 1
                        out.append((req, 1))
            if mixed:
                out += self._advance(decoding, 1.0)
            self._finish()
            return StepResult(self._jitter(secs), out, "prefill", new_tokens, self._matched)
        if not decoding:
            return StepResult(0.0, [], "idle")
        self._check_memory(len(decoding) * self.plan.spec_draft_tokens)
        cost = self.perf.decode_cost(len(decoding), sum(r.kv_tokens for r in decoding))
        out = self._advance(decoding, cost.tokens_per_request)
        self._retract_if_full()
        self._finish()
        return StepResult(self._jitter(cost.seconds), out, "decode")

    def _advance(self, reqs: list[Request], mean_tokens: float) -> list[tuple[Request, int]]:
        out = []
        for req in reqs:
            n, draw = 1, (req.draws or self.rng).random
            if mean_tokens > 1.0:
                n += self.accepted(draw)
            n = min(n, req.stop_at - req.generated)
            if mean_tokens > 1.0 and n > 0:
                self.spec_tokens, self.spec_forwards = self.spec_tokens + n, self.spec_forwards + 1
            if n > 0:
                req.generated += n
                out.append((req, n))
        return out

    def accepted(self, draw: Callable[[], float]) -> int:
        """Draft tokens the target accepts in one verify step: depth by depth, the target's token is
        the draft's candidate of rank 1 with chance `p`, else of rank 2 with chance `p` of the rest,
        and so on; the path goes on while its node is in the verify tree (`PerfModel.tree`). A rank is
        drawn only while the tree holds it, so a chain (top-k 1) draws once per depth."""
        p, tree, path = self.perf.acceptance, self.perf.tree, ()
        while True:
            r = 1
            while (*path, r) in tree and draw() >= p:
                r += 1
            if (*path, r) not in tree:
                return len(path)
            path = (*path, r)

    def _retract_if_full(self) -> None:
        while self.running and sum(r.kv_tokens for r in self.running) > self.capacity:
            req = self.running.pop()
            req.to_prefill, req.prefilled = req.prompt_len + req.generated, 0
            self.waiting.appendleft(req)

    def _finish(self) -> None:
        self.running = [r for r in self.running if not r.done]
