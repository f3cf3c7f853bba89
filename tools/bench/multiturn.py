"""Multi-turn conversations: prompts whose history grows turn by turn, each turn sent only once the
one before it was answered.

Shaped like SGLang's own multi-turn benchmark (`benchmark/hicache/bench_multiturn.py`; the
`multiturn_*` settings mirror its `--num-rounds`, `--request-length`, `--sub-question-input-length`
and `--output-length`): a conversation's first turn is `request_length` tokens; every later turn
sends the whole history again (the first prompt, each earlier question and each earlier answer)
followed by a new question of `sub_question_input_length` tokens. A server that keeps the history's
KV (SGLang's radix cache) prefills only what is new; with `--disable-radix-cache` it prefills the
whole history every turn, and chunked prefill decides how those long prompts share the GPU with
decoding.

The history carries a stand-in for each answer: `output_length` seeded tokens, the length the
server wrote (ignore_eos), not its words. Every prompt of a level is then known before the level
starts, so a baseline and a candidate send identical prompts (`tools.bench.blockfit` needs that);
an answer's own tokens, which SGLang also caches, are prefilled again: reuse is at most
`output_length` tokens a turn short of a client that sends the real answer back.

A level's conversations run closed-loop each and interleave up to its concurrency: a turn whose
answer arrived queues its conversation's next turn behind the turns already waiting (first come,
first served; bench_multiturn's `--ready-queue-policy fifo`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import TypeVar

from tools.bench.prompts import WORDS, Prompt, token_range

T = TypeVar("T")


def multiturn_prompts(
    n: int,
    *,
    num_rounds: int,
    request_length: int,
    sub_question_input_length: int,
    output_length: int,
    seed: int = 0,
    words: bool = False,
    vocab_size: int | None = None,
) -> list[Prompt]:
    """The turns of `n` conversations of `num_rounds` turns each, conversation by conversation and
    turn by turn (`Prompt.conversation` and `Prompt.turn`, each from 0). Token ids, or words for the
    chat API (the parts of a history joined by blank lines). `sub_question_input_length` 0: the
    request length, as bench_multiturn."""
    rng = random.Random(seed)
    lo, hi = token_range(vocab_size)
    question_len = sub_question_input_length or request_length

    def part(k: int) -> list:
        return [rng.choice(WORDS) for _ in range(k)] if words else [rng.randrange(lo, hi) for _ in range(k)]

    out = []
    for i in range(n):
        parts: list[list] = []
        for turn in range(num_rounds):
            if turn:
                parts.append(part(output_length))  # the answer to the turn before, as a stand-in
            parts.append(part(question_len if turn else request_length))
            size = sum(map(len, parts))
            if words:
                body = {"text": "\n\n".join(" ".join(p) for p in parts)}
            else:
                body = {"token_ids": [t for p in parts for t in p]}
            out.append(Prompt(input_len=size, output_len=output_length, conversation=i, turn=turn, **body))
    return out


def conversations(items: Iterable[T], conversation: Callable[[T], int | None]) -> list[list[T]]:
    """`items` as the chains they are sent in: each conversation's turns in their order, in the
    order its first turn appears; an item of no conversation is a chain of its own."""
    chains: list[list[T]] = []
    index: dict[int, list[T]] = {}
    for item in items:
        key = conversation(item)
        if key is None:
            chains.append([item])
        elif key in index:
            index[key].append(item)
        else:
            index[key] = [item]
            chains.append(index[key])
    return chains
