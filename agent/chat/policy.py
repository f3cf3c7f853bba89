"""The builtin policy for `optagent chat`: plain requests mapped onto the planner's own tools.

"research --enable-torch-compile", "try --cuda-graph-max-bs 128", "unset --disable-radix-cache",
"benchmark", "roll back", "show the todo list", "status", "improve throughput" (the whole builtin
workflow). It reads only the message history, like an LLM, so a chat can be resumed.
"""

from __future__ import annotations

import json
import re
from typing import Any

_FLAG = re.compile(r"(?<![\w-])-{0,2}([A-Za-z][\w-]*[A-Za-z0-9])(?:[= ]+([^\s-][^\s]*))?")
HELP = (
    "I understand: 'research --FLAG', 'try --FLAG [VALUE]' (add 'anyway' to override research), "
    "'unset --FLAG', 'benchmark', 'roll back', 'show the todo list', 'status', "
    "'improve throughput' (the whole workflow), and the slash commands (/help)."
)


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, default=str)


def _since_last_prompt(messages: list[Any]) -> tuple[str, list[tuple[str, Any, dict[str, Any]]]]:
    """The latest user request, and the tool returns (name, content, call args) that followed it."""
    from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart

    start, prompt = 0, ""
    for i, m in enumerate(messages):
        if isinstance(m, ModelRequest):
            for p in m.parts:
                if isinstance(p, UserPromptPart):
                    start, prompt = i, _text(p.content)
    calls: dict[str, dict[str, Any]] = {}
    returns = []
    for m in messages[start:]:
        for p in m.parts:
            if isinstance(m, ModelResponse) and isinstance(p, ToolCallPart):
                calls[p.tool_call_id] = p.args_as_dict()
            elif isinstance(p, ToolReturnPart):
                returns.append((p.tool_name, p.content, calls.get(p.tool_call_id, {})))
    return prompt, returns


def _researched(messages: list[Any]) -> set[str]:
    """Flags with a research verdict anywhere in the conversation."""
    from pydantic_ai.messages import ToolReturnPart

    return {
        p.content.get("flag")
        for m in messages
        for p in m.parts
        if isinstance(p, ToolReturnPart) and p.tool_name == "research_flag" and isinstance(p.content, dict)
    }


def parse_change(text: str) -> dict[str, Any] | None:
    """`try --cuda-graph-max-bs 128` -> {"flag": "--cuda-graph-max-bs", "value": "128", "action": "set"}."""
    words = text.split(maxsplit=1)
    if len(words) < 2:
        return None
    rest = re.sub(r"\b(anyway|please|force|now)\b", "", words[1]).strip()
    m = _FLAG.match(rest)
    if m is None:
        return None
    flag, value = "--" + m.group(1).replace("_", "-"), m.group(2)
    action = "unset" if words[0].lower() in ("unset", "remove", "drop") else "set"
    return {"flag": flag, "value": None if action == "unset" else value, "action": action}


def _flag_of(text: str) -> str | None:
    words = text.split(maxsplit=1)
    m = _FLAG.match(words[1].strip()) if len(words) == 2 else None
    return "--" + m.group(1).replace("_", "-") if m else None


def describe_levels(levels: Any) -> str:
    """`c1: 101 tok/s, c64: 2,270 tok/s` from a `{level: tok/s}` mapping."""
    if not isinstance(levels, dict) or not levels:
        return "no numbers"
    return ", ".join(
        f"c{c}: {v:,.0f} tok/s" if isinstance(v, int | float) else f"c{c}: missing" for c, v in levels.items()
    )


def _summary(name: str, content: Any) -> str:
    """What the chat tells the user after a tool returned."""
    if isinstance(content, dict) and content.get("error"):
        return f"{name}: {content['error']}"
    if name == "research_flag" and isinstance(content, dict):
        ev = "; ".join(
            f"{e.get('location')}: {str(e.get('quote', '')).strip()}" for e in content.get("evidence", [])[:2]
        )
        return f"{content.get('flag')}: {content.get('verdict')} — {content.get('summary', '')}" + (
            f"\nevidence: {ev}" if ev else ""
        )
    if name == "run_trial" and isinstance(content, dict):
        if content.get("dry_run"):
            return f"dry run: would trial {content.get('would_trial')}"
        ratio = content.get("ratio")
        gain = f" ({(ratio - 1) * 100:+.1f}%)" if isinstance(ratio, int | float) else ""
        return (
            f"trial {content.get('trial')} [{', '.join(content.get('changes', []))}]: "
            f"{str(content.get('decision', '?')).replace('_', ' ')}{gain} — {content.get('why', '')}\n"
            f"candidate: {describe_levels(content.get('output_tok_s'))}\n"
            f"baseline:  {describe_levels(content.get('baseline_output_tok_s'))}"
        )
    if name == "benchmark" and isinstance(content, dict):
        partial = " (partial: some requests failed)" if content.get("partial") else ""
        return f"benchmark of the deployed configuration: {describe_levels(content.get('output_tok_s'))}{partial}"
    return f"{name}: {_text(content)}"


def chat_policy(messages: list[Any], info: Any) -> Any:
    """Answer the latest chat request with one tool call, then a short report of what it returned."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart

    prompt, returns = _since_last_prompt(messages)
    text = prompt.strip()
    low = text.lower()
    done = {name for name, _, _ in returns}

    def call(name: str, args: dict[str, Any]) -> Any:
        return ModelResponse(parts=[ToolCallPart(name, args)], model_name="builtin")

    def say(reply: str) -> Any:
        return ModelResponse(parts=[TextPart(reply)], model_name="builtin")

    if re.match(r"^(improve|optimi[sz]e|make .* faster|go\b|auto)", low):
        from agent.policy.builtin import planner_policy

        return planner_policy(messages, info)
    if low.startswith("research"):
        flag = _flag_of(text)
        if flag is None:
            return say("research which flag? e.g. 'research --enable-torch-compile'")
        if "research_flag" not in done:
            return call("research_flag", {"flag": flag})
        return say(_summary("research_flag", returns[-1][1]))
    if re.match(r"^(try|trial|apply|set|enable|unset|remove|drop)\b", low):
        change = parse_change(text)
        if change is None:
            return say("try which flag? e.g. 'try --cuda-graph-max-bs 128'")
        args: dict[str, Any] = {"changes": [change], "reason": f"requested in chat: {text}"}
        if re.search(r"\b(anyway|force)\b", low):
            args["override_reason"] = f"the user asked for it in chat: {text}"
        researched = change["flag"] in _researched(messages)
        if not researched and "research_flag" not in done:
            return call("research_flag", {"flag": change["flag"]})
        trials = [c for n, c, _ in returns if n == "run_trial"]
        if not trials:
            return call("run_trial", args)
        research = [c for n, c, _ in returns if n == "research_flag"]
        head = _summary("research_flag", research[-1]) + "\n" if research else ""
        return say(head + _summary("run_trial", trials[-1]))
    if re.match(r"^(bench|benchmark|measure)", low):
        return (
            call("benchmark", {}) if "benchmark" not in done else say(_summary("benchmark", returns[-1][1]))
        )
    if re.match(r"^(roll ?back|undo|revert)", low):
        return call("undo_last_kept", {}) if "undo_last_kept" not in done else say(_text(returns[-1][1]))
    if "todo" in low or low.startswith(("plan", "list")):
        return call("show_todo", {}) if "show_todo" not in done else say(_text(returns[-1][1]))
    if low.startswith("status"):
        return (
            call("show_status", {})
            if "show_status" not in done
            else say(_summary("show_status", returns[-1][1]))
        )
    return say(HELP)
