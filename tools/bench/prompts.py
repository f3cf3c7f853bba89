"""Benchmark prompts: seeded random token-id prompts of an exact length, or a JSONL prompt file."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

# Token ids in this range exist in every common LLM vocabulary (all have >= 32k entries) and
# avoid the low ids where special tokens usually live; a smaller vocabulary narrows it (`token_range`).
_TOKEN_RANGE = (1000, 30000)
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "by",
    "at",
    "from",
    "that",
    "this",
    "which",
    "have",
    "be",
    "it",
    "not",
    "or",
    "an",
    "model",
    "server",
    "token",
    "cache",
    "batch",
    "graph",
    "kernel",
    "memory",
    "request",
    "latency",
    "stream",
    "value",
    "system",
    "time",
    "data",
    "first",
    "later",
    "about",
    "after",
    "before",
    "under",
    "over",
    "between",
    "river",
    "city",
    "night",
    "light",
]
"""Words random text prompts are drawn from (the chat API takes text, not token ids)."""


class PromptFileError(ValueError):
    """A prompt file that cannot be used; the message names the line."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One benchmark request body's input: token ids or text, and the exact output length."""

    input_len: int
    output_len: int
    token_ids: list[int] | None = None
    text: str | None = None
    conversation: int | None = None
    """The conversation this prompt is a turn of (`tools.bench.multiturn`); None: a prompt alone."""
    turn: int | None = None
    """Its turn in that conversation, from 0: sent only once the turn before it was answered."""


def token_range(vocab_size: int | None) -> tuple[int, int]:
    """Where random token ids are drawn from: 1000-30000, or below a smaller vocabulary's size (a
    server indexes its embedding with them: an id past the vocabulary fails the whole batch)."""
    lo, hi = _TOKEN_RANGE
    if vocab_size is None or vocab_size >= hi:
        return lo, hi
    return min(lo, vocab_size // 2), vocab_size


def random_prompts(
    n: int,
    *,
    input_len: int,
    output_len: int,
    seed: int = 0,
    words: bool = False,
    vocab_size: int | None = None,
) -> list[Prompt]:
    """`n` prompts of exactly `input_len` random token ids (or ~`input_len` random words, for the
    chat API which takes text), reproducible from `seed`."""
    rng = random.Random(seed)
    lo, hi = token_range(vocab_size)
    out = []
    for _ in range(n):
        if words:
            text = " ".join(rng.choice(WORDS) for _ in range(input_len))
            out.append(Prompt(input_len=input_len, output_len=output_len, text=text))
        else:
            ids = [rng.randrange(lo, hi) for _ in range(input_len)]
            out.append(Prompt(input_len=input_len, output_len=output_len, token_ids=ids))
    return out


def shared_prefix_prompts(
    n: int,
    *,
    num_groups: int,
    prompts_per_group: int,
    system_prompt_len: int,
    question_len: int,
    output_len: int,
    seed: int = 0,
    words: bool = False,
    vocab_size: int | None = None,
) -> list[Prompt]:
    """`n` prompts shaped like `bench_serving --dataset-name generated-shared-prefix` (SGLang 0.5.23,
    `benchmark/datasets/generated_shared_prefix.py`; the arguments mirror its `--gsp-*` flags):
    groups of `prompts_per_group` prompts that start with the group's `system_prompt_len`-token
    system prompt and end with a `question_len`-token question of their own, shuffled as
    bench_serving does unless `--gsp-ordered`. A level sends fewer prompts than the whole dataset
    (`num_groups` x `prompts_per_group`), so it takes ceil(n / prompts_per_group) groups (at most
    `num_groups`): each level reuses prefixes as often as the dataset does. Token ids, or words for
    the chat API (system prompt and question joined by a blank line, as bench_serving's text)."""
    rng = random.Random(seed)
    groups = max(1, min(num_groups, -(-n // prompts_per_group)))
    lo, hi = token_range(vocab_size)

    def tokens(k: int) -> list[int]:
        return [rng.randrange(lo, hi) for _ in range(k)]

    def text(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))

    systems = [text(system_prompt_len) if words else tokens(system_prompt_len) for _ in range(groups)]
    out = []
    for i in range(n):
        system = systems[(i // prompts_per_group) % groups]
        length = system_prompt_len + question_len
        if words:
            prompt_text = f"{system}\n\n{text(question_len)}"
            out.append(Prompt(input_len=length, output_len=output_len, text=prompt_text))
        else:
            out.append(
                Prompt(input_len=length, output_len=output_len, token_ids=system + tokens(question_len))
            )
    rng.shuffle(out)
    return out


def load_prompt_file(path: Path, *, output_len: int) -> list[Prompt]:
    """Read a JSONL prompt file: one object per line with `prompt` (or `text`), or a ShareGPT
    `conversations` list (the first human turn is used); optional `output_len`/`max_tokens`."""
    prompts = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{path}:{lineno}: not valid JSON: {e.msg}") from e
        text = _prompt_text(item) if isinstance(item, dict) else None
        if not text:
            raise PromptFileError(f"{path}:{lineno}: no `prompt`, `text` or `conversations` text")
        olen = item.get("output_len") or item.get("max_tokens") or output_len
        if not isinstance(olen, int) or olen < 1:
            raise PromptFileError(f"{path}:{lineno}: output_len must be a positive integer")
        prompts.append(Prompt(input_len=len(text.split()), output_len=olen, text=text))
    if not prompts:
        raise PromptFileError(f"{path}: no prompts")
    return prompts


def _prompt_text(item: dict) -> str | None:
    for key in ("prompt", "text"):
        if isinstance(item.get(key), str):
            return item[key]
    for turn in item.get("conversations") or []:
        if isinstance(turn, dict) and turn.get("from") in ("human", "user"):
            value = turn.get("value")
            return value if isinstance(value, str) else None
    return None
