"""The builtin policy's view of a pydantic-ai message history: the tool returns it holds (with the
arguments of their calls), and the tool calls and responses it answers with. Moved from `builtin.py`."""

from __future__ import annotations

from typing import Any


def tool_returns(messages: list[Any]) -> list[tuple[str, Any, dict[str, Any]]]:
    """Every tool return in the history: (tool name, content, args of its call)."""
    from pydantic_ai.messages import ModelResponse, ToolCallPart, ToolReturnPart

    calls: dict[str, dict[str, Any]] = {}
    out = []
    for m in messages:
        for p in m.parts:
            if isinstance(m, ModelResponse) and isinstance(p, ToolCallPart):
                calls[p.tool_call_id] = p.args_as_dict()
            elif isinstance(p, ToolReturnPart):
                out.append((p.tool_name, p.content, calls.get(p.tool_call_id, {})))
    return out


def tool_call(name: str, args: dict[str, Any]) -> Any:
    """A call of tool `name` with `args`, as a builtin policy answers with it."""
    from pydantic_ai.messages import ToolCallPart

    return ToolCallPart(name, args)


def builtin_response(parts: list[Any]) -> Any:
    """The model response of a builtin policy made of `parts` (tool calls, text)."""
    from pydantic_ai.messages import ModelResponse

    return ModelResponse(parts=parts, model_name="builtin")
