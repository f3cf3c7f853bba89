"""Run a pydantic-ai agent step by step, saving its messages to the transcript after every step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TokenCount:
    """Requests and tokens per agent of a run (`planner`, `researcher:--flag`, ...), from the usage
    each model response reports."""

    agents: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, name: str, used: dict[str, int]) -> None:
        """Add one agent run's `{"requests", "input_tokens", "output_tokens"}`."""
        mine = self.agents.setdefault(name, {"requests": 0, "input_tokens": 0, "output_tokens": 0})
        for k in mine:
            mine[k] += used.get(k, 0)

    def by_kind(self) -> dict[str, dict[str, int]]:
        """Totals per kind of agent (`researcher:--x` counts as `researcher`), and `total`."""
        out: dict[str, dict[str, int]] = {}
        for name, used in sorted(self.agents.items(), key=lambda kv: kv[0] != "planner"):
            for key in (name.split(":")[0], "total"):
                mine = out.setdefault(key, {"requests": 0, "input_tokens": 0, "output_tokens": 0})
                for k in mine:
                    mine[k] += used[k]
        if "total" in out:  # last
            out["total"] = out.pop("total")
        return out

    def line(self) -> str:
        """`planner: 12 requests, 30,100 in / 2,000 out; researcher: ...; total: ...`."""
        return (
            "; ".join(
                f"{k}: {u['requests']} requests, {u['input_tokens']:,} in / {u['output_tokens']:,} out"
                for k, u in self.by_kind().items()
            )
            or "no model requests"
        )


def usage_of(messages: list[Any]) -> dict[str, int]:
    """Requests and tokens of the model responses among `messages`."""
    from pydantic_ai.messages import ModelResponse

    responses = [m for m in messages if isinstance(m, ModelResponse)]
    return {
        "requests": len(responses),
        "input_tokens": sum(m.usage.input_tokens or 0 for m in responses),
        "output_tokens": sum(m.usage.output_tokens or 0 for m in responses),
    }


async def run_saving(
    agent: Any,
    prompt: str | None,
    *,
    deps: Any,
    transcript: Any,
    name: str,
    parent: int | None = None,
    usage: Any = None,
    usage_limits: Any = None,
    instructions: str | None = None,
    message_history: list[Any] | None = None,
    on_response: Callable[[int], None] | None = None,
    capabilities: list[Any] | None = None,
    on_usage: Callable[[str, dict[str, int]], None] | None = None,
) -> Any:
    """`agent.iter` to completion; after each node the new messages go to `transcript`.

    `on_response(msg)` is called with the transcript number of each model response before its tool
    calls run, so subagents spawned by those calls can name it as their parent. However the run
    ends, its requests and tokens are recorded (a `usage` event) and passed to `on_usage(name, ...)`.
    """
    from pydantic_ai.messages import ModelResponse

    saved = len(message_history or [])
    kwargs: dict[str, Any] = {"deps": deps, "usage": usage, "usage_limits": usage_limits}
    if instructions is not None:
        kwargs["instructions"] = instructions
    if message_history:
        kwargs["message_history"] = message_history
    if capabilities:
        kwargs["capabilities"] = capabilities
    start = saved
    async with agent.iter(prompt, **kwargs) as run:
        try:
            async for _node in run:
                saved = _save(run, saved, transcript, name, parent, on_response, ModelResponse)
            _save(run, saved, transcript, name, parent, on_response, ModelResponse)
        finally:
            used = usage_of(run.all_messages()[start:])
            if transcript is not None:
                transcript.event("usage", {"agent": name, **used}, msg=parent)
            if on_usage is not None:
                on_usage(name, used)
        return run.result


def _save(
    run: Any, saved: int, transcript: Any, name: str, parent: int | None, on_response: Any, resp_type: Any
) -> int:
    messages = run.all_messages()
    new = messages[saved:]
    if not new:
        return saved
    numbers = transcript.add_messages(new, agent=name, parent=parent) if transcript is not None else []
    if on_response is not None:
        for msg, n in zip(new, numbers, strict=False):
            if isinstance(msg, resp_type):
                on_response(n)
    return len(messages)
