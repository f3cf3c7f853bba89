"""Readable, deterministic output text: one word per token from a seeded vocabulary.

Greedy decoding (temperature 0) of the same prompt always gives the same words. A lossy KV cache
gives the same start and then drifts; a broken numeric setup gives garbage.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from functools import cache
from typing import Any

_SYLLABLES = tuple(
    ["ka", "lo", "mi", "ren", "sa", "tor", "vel", "an", "de", "qu", "is", "or", "pra", "ne", "ul", "shi"]
)
_COMMON = tuple(
    [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "that",
        "for",
        "it",
        "as",
        "with",
        "on",
        "was",
        "by",
        "at",
        "from",
        "this",
        "be",
        "are",
        "or",
        "an",
        "which",
    ]
)
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


@cache
def vocabulary() -> tuple[str, ...]:
    """About two thousand word-like tokens, the same on every machine."""
    rng = random.Random(20240917)
    words = set(_COMMON)
    while len(words) < 2000:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))))
    return tuple(sorted(words))


def prompt_key(prompt: Any) -> int:
    """A stable 64-bit key for a prompt (text, token ids or chat messages)."""
    blob = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(blob.encode()).digest()[:8], "big")


def prompt_tokens(prompt: Any) -> list[Any]:
    """The prompt as tokens: the ids of a token-id prompt, else its words and punctuation."""
    if isinstance(prompt, list):
        return prompt
    return _TOKEN_RE.findall(str(prompt))


def count_prompt_tokens(prompt: Any) -> int:
    """Token count of a prompt: the list length for token ids, a word/punctuation split for text."""
    if isinstance(prompt, list):
        return len(prompt)
    return max(1, len(_TOKEN_RE.findall(str(prompt))))


def greedy_length(key: int, max_new: int) -> int:
    """Where greedy decoding of this prompt would emit EOS (when EOS is honoured)."""
    return min(max_new, 24 + key % 160)


class TextStream:
    """The words of one response, produced a few tokens at a time."""

    def __init__(self, key: int, *, greedy: bool, lossy: str | None = None) -> None:
        self._vocab = vocabulary()
        seed = key if greedy else random.SystemRandom().getrandbits(64)
        self._rng = random.Random(seed)
        self._drift_at = 6 + key % 24 if lossy == "drift" else None
        self._drift_seed = seed ^ 0x5EED
        self._garbage = lossy == "garbage"
        self._pos = 0

    def _word(self) -> str:
        if self._garbage:
            return "".join(self._rng.choice("�#@%&?*!~^") for _ in range(self._rng.randint(1, 4)))
        if self._pos and self._rng.random() < 0.35:
            return self._rng.choice(_COMMON)
        return self._vocab[self._rng.randrange(len(self._vocab))]

    def next_text(self, n: int) -> str:
        """The text of the next `n` tokens, each with its leading space."""
        out = []
        for _ in range(n):
            if self._drift_at is not None and self._pos == self._drift_at:
                self._rng = random.Random(self._drift_seed)
            word = self._word()
            if self._pos and self._pos % 13 == 12 and not self._garbage:
                word += "."
            out.append(" " + word)
            self._pos += 1
        return "".join(out)
