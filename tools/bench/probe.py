"""Correctness probe: fixed prompts at temperature 0, compared with the baseline's answers.

A candidate is `identical`, `drifting` (same start, later divergence, as lossy numerics do) or
`broken` (errors, empty answers, degenerate repetition, garbage, or most answers wrong from the
first word). Positions are counted in whitespace-separated words and in characters.
"""

from __future__ import annotations

import asyncio
import json
import time
from importlib import resources
from pathlib import Path
from typing import Literal

import httpx
from pydantic import BaseModel

from tools.auth import auth_headers
from tools.localfiles import write_text
from tools.redact import redact_text

Status = Literal["identical", "drifting", "broken"]
DEFAULT_MAX_TOKENS = 48
PROBE_TOTAL_S = 300.0
"""The whole probe's bound: 8 prompts of 48 tokens take seconds on a GPU and ~10 s on the real CPU
server here; a candidate that takes minutes to answer them is broken for the probe's purpose."""


class ProbeOutput(BaseModel):
    id: str
    text: str = ""
    error: str | None = None


class ProbeResult(BaseModel):
    """The answers of one server to the probe prompts; the baseline's is the reference."""

    endpoint: str
    api: str
    max_tokens: int
    outputs: list[ProbeOutput]
    seconds: float = 0.0
    """Wall seconds the probe took, its requests one at a time (0: not timed)."""
    tokens: int = 0
    """Tokens its answers held, as the server counted them (else their words; 0: not counted)."""

    def token_seconds(self) -> float | None:
        """Wall seconds per answer token, one request at a time, first-token wait included: the
        fastest a benchmark here decodes each of its requests (None: not timed)."""
        return self.seconds / self.tokens if self.seconds > 0 and self.tokens > 0 else None

    def save(self, path: Path) -> None:
        write_text(path, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> ProbeResult:
        return cls.model_validate_json(Path(path).read_text())


class ProbeDiff(BaseModel):
    """Where one answer first differs from the reference."""

    id: str
    status: Status
    word: int | None = None
    char: int | None = None
    reason: str = ""
    reference: str = ""
    candidate: str = ""


class ProbeVerdict(BaseModel):
    status: Status
    first_diff: ProbeDiff | None = None
    """The earliest divergence over all prompts (None when identical)."""
    prompts: list[ProbeDiff]
    summary: str


def probe_prompts() -> list[dict[str, str]]:
    """The shipped prompt set (`probe_prompts.jsonl` in this package)."""
    text = resources.files("tools.bench").joinpath("probe_prompts.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _request(api: str, prompt: str, max_tokens: int) -> tuple[str, dict]:
    if api == "generate":
        params = {"max_new_tokens": max_tokens, "temperature": 0}
        return "/generate", {"text": prompt, "sampling_params": params}
    body = {"model": "default", "max_tokens": max_tokens, "temperature": 0}
    if api == "chat":
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**body, "prompt": prompt}


def _tokens(api: str, data: dict, text: str) -> int:
    """The answer's tokens as the server counted them (`usage`, `/generate`'s `meta_info`), else its
    words (fewer than its tokens: a slower estimate of the speed, never a faster one)."""
    usage = data.get("meta_info") if api == "generate" else data.get("usage")
    counted = (usage or {}).get("completion_tokens")
    return int(counted) if isinstance(counted, int) and counted > 0 else len(text.split())


def _answer(api: str, data: dict) -> str:
    if api == "generate":
        return data["text"]
    choice = data["choices"][0]
    return choice["message"]["content"] if api == "chat" else choice["text"]


async def run_probe(
    endpoint: str,
    *,
    api: str = "completions",
    max_tokens: int = DEFAULT_MAX_TOKENS,
    timeout_s: float = 120.0,
    total_s: float = PROBE_TOTAL_S,
    api_key: str | None = None,
) -> ProbeResult:
    """Send every probe prompt once, one at a time (batch composition can change numerics),
    at temperature 0. Failures are recorded per prompt, never raised; the first one ends the probe
    (one failed prompt already makes it broken, and a server that hangs would keep each of the rest
    waiting as long). Each request is bounded in all by `timeout_s`, the whole probe by `total_s`:
    a server that answers every prompt just inside `timeout_s` is out of the probe (and a trial's
    candidate out of production) after `total_s`, not after one `timeout_s` per prompt."""
    endpoint = endpoint.rstrip("/")
    outputs, tokens, started = [], 0, time.monotonic()
    headers = auth_headers(api_key)  # default: $OPTAGENT_API_KEY
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False, headers=headers) as client:
        for item in probe_prompts():
            path, body = _request(api, item["prompt"], max_tokens)
            bound = min(timeout_s, total_s - (time.monotonic() - started))
            try:
                if bound <= 0:
                    raise TimeoutError
                async with asyncio.timeout(bound):
                    resp = await client.post(endpoint + path, json=body)
                if resp.status_code != 200:
                    raise ValueError(f"HTTP {resp.status_code}: {resp.text[:200]}")
                data = resp.json()
                outputs.append(ProbeOutput(id=item["id"], text=_answer(api, data)))
                tokens += _tokens(api, data, outputs[-1].text)
            except TimeoutError:
                why = (f"no answer in {timeout_s:g} s" if bound == timeout_s
                       else f"the probe's {total_s:g} s bound ran out")  # fmt: skip
                outputs.append(ProbeOutput(id=item["id"], error=f"timed out: {why}"))
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
                outputs.append(ProbeOutput(id=item["id"], error=f"{type(e).__name__}: {e}"))
            if outputs[-1].error:
                break
    return ProbeResult(
        endpoint=redact_text(endpoint), api=api, max_tokens=max_tokens, outputs=outputs,
        seconds=time.monotonic() - started, tokens=tokens,
    )  # fmt: skip


def degenerate(text: str) -> str | None:
    """Why `text` looks like a broken model's output, or None."""
    words = text.split()
    if not words:
        return "empty answer"
    visible = [ch for ch in text if not ch.isspace()]
    if "\ufffd" in text or sum(ch.isalnum() for ch in visible) < 0.5 * len(visible):
        return "garbage characters"
    if len(words) >= 12:
        tail = words[len(words) // 2 :]
        for period in range(1, 5):
            if all(tail[i] == tail[i % period] for i in range(len(tail))):
                return f"repeats a {period}-word cycle"
    return None


def _diff_one(ref: ProbeOutput, cand: ProbeOutput | None) -> ProbeDiff:
    if cand is None or cand.error:
        return ProbeDiff(
            id=ref.id, status="broken", reason=f"request failed: {cand.error if cand else 'missing'}"
        )
    if cand.text == ref.text:
        return ProbeDiff(id=ref.id, status="identical")
    char = next((i for i, (a, b) in enumerate(zip(ref.text, cand.text, strict=False)) if a != b), None)
    char = min(len(ref.text), len(cand.text)) if char is None else char
    word = len(cand.text[:char].split())
    if cand.text[:char] and not cand.text[:char][-1].isspace() and char < len(cand.text):
        word -= 1  # the divergence is inside a word
    excerpt = dict(reference=ref.text[char : char + 40], candidate=cand.text[char : char + 40])
    why = degenerate(cand.text)
    if why and not degenerate(ref.text):
        return ProbeDiff(id=ref.id, status="broken", word=word, char=char, reason=why, **excerpt)
    return ProbeDiff(id=ref.id, status="drifting", word=word, char=char, reason="diverges", **excerpt)


def compare_probe(reference: ProbeResult, candidate: ProbeResult) -> ProbeVerdict:
    """Compare a candidate's probe answers with the reference's, prompt by prompt."""
    by_id = {o.id: o for o in candidate.outputs}
    usable = [o for o in reference.outputs if not o.error]
    if not usable:
        d = ProbeDiff(id="*", status="broken", reason="the reference has no answers")
        return ProbeVerdict(
            status="broken", first_diff=d, prompts=[d], summary="broken: the reference has no answers"
        )
    diffs = [_diff_one(ref, by_id.get(ref.id)) for ref in usable]
    from_start = [d for d in diffs if d.status == "drifting" and d.word == 0]
    if len(from_start) * 2 > len(diffs):
        for d in from_start:
            d.status, d.reason = "broken", "differs from the first word"
    changed = [d for d in diffs if d.status != "identical"]
    status: Status = (
        "broken" if any(d.status == "broken" for d in diffs) else "drifting" if changed else "identical"
    )
    first = min(
        changed, key=lambda d: (d.status != "broken", d.word if d.word is not None else -1), default=None
    )
    if first is None:
        summary = f"identical: all {len(diffs)} answers match the reference"
    else:
        where = f" at word {first.word} (char {first.char})" if first.word is not None else ""
        summary = f"{status}: {len(changed)} of {len(diffs)} answers differ; first: {first.id}{where}: {first.reason}"
    return ProbeVerdict(status=status, first_diff=first, prompts=diffs, summary=summary)
