"""Run a pydantic-ai agent step by step, saving its messages to the transcript after every step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


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
) -> Any:
    """`agent.iter` to completion; after each node the new messages go to `transcript`.

    `on_response(msg)` is called with the transcript number of each model response before its tool
    calls run, so subagents spawned by those calls can name it as their parent.
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
    async with agent.iter(prompt, **kwargs) as run:
        async for _node in run:
            saved = _save(run, saved, transcript, name, parent, on_response, ModelResponse)
        _save(run, saved, transcript, name, parent, on_response, ModelResponse)
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
