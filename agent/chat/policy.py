"""The builtin policy for `optagent chat`: plain requests mapped onto the planner's own tools.

"research --enable-torch-compile", "try --cuda-graph-max-bs 128", "unset --disable-radix-cache",
"benchmark", "roll back", "show the todo list", "status", "improve throughput" (the whole builtin
workflow). It reads only the message history, like an LLM, so a chat can be resumed.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agent.chat.deployed import deployed_lines
from tools.flagname import flag_name

_FLAG = re.compile(r"(?<![\w-])-{0,2}([A-Za-z][\w-]*[A-Za-z0-9])(?:[= ]+([^\s-][^\s]*))?")
HELP = (
    "I understand: 'what would you try first?', 'list the candidates', 'research --FLAG', "
    "'why not --FLAG?', 'try --FLAG [VALUE]' (add 'anyway' to override research), "
    "'unset --FLAG', 'what is deployed now?', 'benchmark', 'undo' or 'roll back', "
    "'show the todo list', 'status', 'improve throughput' (the whole workflow), and the slash "
    "commands (/help)."
)
_CANDIDATES = re.compile(r"\b(candidates?|options|levers|ideas|all of them)\b")
_FIRST = re.compile(
    r"\b(first|next|pick|best|suggest|recommend|what (would|should|could|can) (you|we|i) (try|do|change)|"
    r"what (next|now))\b"
)
_DEPLOYED = re.compile(r"\b(what('s| is)( \w+)? (deployed|running|set)|deployed now|what runs)\b")
_WHY_NOT = re.compile(r"^why (not|didn'?t you|did you not|no)\b")


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
    flag, value = flag_name(m.group(1)), m.group(2)
    action = "unset" if words[0].lower() in ("unset", "remove", "drop") else "set"
    return {"flag": flag, "value": None if action == "unset" else value, "action": action}


def _flag_of(text: str) -> str | None:
    words = text.split(maxsplit=1)
    m = _FLAG.match(words[1].strip()) if len(words) == 2 else None
    return flag_name(m.group(1)) if m else None


def describe_levels(levels: Any) -> str:
    """`c1: 101 tok/s, c64: 2,270 tok/s` from a `{level: tok/s}` mapping."""
    if not isinstance(levels, dict) or not levels:
        return "no numbers"
    return ", ".join(
        f"c{c}: {v:,.0f} tok/s" if isinstance(v, int | float) else f"c{c}: missing" for c, v in levels.items()
    )


def candidates_text(content: Any) -> str:
    """The playbook's candidates, what each would change and whether it is still worth a trial."""
    if not isinstance(content, list) or not content:
        return "the playbook has no candidate for this deployment"
    order = {"high": 0, "medium": 1, "low": 2}
    open_ = [c for c in content if c.get("status") in ("candidate", "no-op", "incompatible")]
    lines = [f"{len(open_)} of {len(content)} playbook candidates are worth researching here:"]
    for c in sorted(content, key=lambda c: (c.get("status") != "candidate", order.get(c.get("priority"), 3))):
        change = c["flag"] if c.get("value") is None else f"{c['flag']} {c['value']}"
        if c.get("action") == "unset":
            change = f"unset {c['flag']}"
        lossy = ", lossy" if c.get("lossy") else ""
        why = c.get("helps") if c.get("status") == "candidate" else f"{c.get('status')}: {c.get('note')}"
        lines.append(f"  {change} ({c.get('priority')}{lossy}) — {why}")
    lines.append("say 'research --FLAG' to check one in the code, 'try --FLAG VALUE' to trial it")
    return "\n".join(lines)


def status_text(content: Any) -> str:
    """`show_status` in words: what is deployed, the trials, restarts and budget."""
    if not isinstance(content, dict):
        return _text(content)
    if content.get("dry_run"):
        return f"dry run: nothing is deployed by this session; verdicts: {content.get('verdicts') or 'none'}"
    best = content.get("deployed_best")
    lines = [f"deployed: {'the configuration at start' if best == 'baseline' else f'trial {best}'}"]
    for t in content.get("trials", []):  # the decision with its deciding level, as every output says it
        said = t.get("headline") or str(t.get("decision", "?")).replace("_", " ")
        lines.append(f"  trial {t.get('trial')} {', '.join(t.get('changes', []))}: {said}")
    lines.append(f"restarts: {content.get('restarts', 0)}, budget: {content.get('budget')}")
    return "\n".join(lines)


def _research_reply(v: dict[str, Any], *, why_not: bool = False) -> str:
    """After research: what comes next. The verdict, its summary and evidence were printed as they
    arrived; the reply repeated them (issue 28: research output printed twice)."""
    flag = v.get("flag")
    done = f"I researched {flag} in the running version's source (the verdict is above)"
    if v.get("verdict") in ("applies", "unknown"):
        return f"{done}: it is worth a trial, 'try {flag} [VALUE]' or 'unset {flag}' runs one"
    why = "that is why it is not worth a trial" if why_not else "not worth a trial"
    return f"{done}: {why} ('try {flag} VALUE anyway' overrides research)"


def _trial_reply(content: dict[str, Any]) -> str:
    """After a trial: why it was decided so, and the numbers the decision compared. Its headline
    (the decision and the deciding level) was printed when it ended; the reply does not repeat it."""
    if content.get("dry_run"):
        return "dry run: nothing was deployed"
    if content.get("already_deployed"):
        return f"{', '.join(content['already_deployed'])}: already deployed; no trial, no restart"
    # the numbers the decision used (the paired blocks), not the geometric mean nor a baseline
    # measured earlier under another load (issue 28: one truth for every number about a change)
    decided = content.get("decided") or {}
    if not decided:  # nothing measured: the headline said why
        return f"trial {content.get('trial')} ended with no numbers to compare (why is above)"
    per_level = "; ".join(f"c={c}: {v}" for c, v in decided.items())
    return (
        f"trial {content.get('trial')}: {_reason(str(content.get('why') or 'no reason given'))}\n"
        f"per level, known-good -> candidate (the blocks the decision compared): {per_level}"
    )


def _reason(why: str) -> str:
    """A trial's `why` without its figures (`...; <objective> +27.9% [..] (95% CI); c=1 +31.4% [..],
    c=2 ...; 6+6 known-good vs ...`): the per-level line gives the decision's own numbers, and the
    geometric mean is not what the rule decided on."""
    parts = why.split("; ")
    at = next((i for i, part in enumerate(parts) if part.endswith("(95% CI)")), None)
    return why if at is None else "; ".join(parts[:at] + parts[at + 2 :])


_SAID_ERRORS = {
    "research_flag": "the research reached no verdict (why is above); the flag stays unresearched, so no trial of it",
    "run_trial": "nothing was deployed (why is above)",
}
"""Tools whose failures the chat printed as they happened (a refusal, a spent budget, a research
that gave up): the reply says what it means instead of printing the reason again."""


def _summary(name: str, content: Any) -> str:
    """What the chat tells the user after a tool returned."""
    if isinstance(content, dict) and content.get("error"):
        return _SAID_ERRORS.get(name) or f"{name}: {content['error']}"
    if name == "research_flag" and isinstance(content, dict):
        return _research_reply(content)
    if name == "list_candidates":
        return "I listed the playbook's candidates for this deployment.\n" + candidates_text(content)
    if name == "show_status":
        return status_text(content)
    if name == "run_trial" and isinstance(content, dict):
        return _trial_reply(content)
    if name == "benchmark" and isinstance(content, dict):
        partial = " (partial: some requests failed)" if content.get("partial") else ""
        return f"benchmark of the deployed configuration: {describe_levels(content.get('output_tok_s'))}{partial}"
    return f"{name}: {_text(content)}"


def _last(returns: list[tuple[str, Any, dict[str, Any]]], name: str) -> dict[str, Any]:
    """The latest return of tool `name` in this turn, as a dict ({} when none or not a dict)."""
    content = next((c for n, c, _ in reversed(returns) if n == name), None)
    return content if isinstance(content, dict) else {}


def _already_reply(held: list[str], state: dict[str, Any]) -> str:
    """A requested change the deployed configuration already holds: said at once, with since when."""
    previous = state.get("previous_session") or {}
    flags = {h.removeprefix("unset ").split()[0] for h in held}
    since = [c for c in previous.get("changes") or [] if flags & set(c.split())]
    who = (
        f"; it came after the {previous['kind']} {previous['id']} started ({'; '.join(since)})"
        if since
        else ""
    )
    return (
        f"{', '.join(held)}: already deployed ({state.get('read_from')}){who}. A trial would restart for "
        "nothing, so none was run (no baseline, no restart); 'what is deployed now?' shows every flag"
    )


def _first_pick(messages: list[Any], returns: list[Any], done: set[str], call: Any, say: Any) -> Any:
    """One first pick and its reason in the order a run uses (`agent.policy.builtin.pick`):
    the candidates, then research of those that could still come first, then the answer."""
    from agent.policy.builtin.messages import tool_returns
    from agent.policy.builtin.pick import could_come_first, first_pick_text, tried_flags

    if "list_candidates" not in done:
        return call("list_candidates", {})
    cands = next(c for n, c, _ in reversed(returns) if n == "list_candidates")
    if not isinstance(cands, list):
        return say(_summary("list_candidates", cands))
    every = tool_returns(messages)  # the whole conversation: verdicts and trials of earlier turns count
    verdicts = {
        c["flag"]: c for n, c, _ in every if n == "research_flag" and isinstance(c, dict) and "verdict" in c
    }
    tried = tried_flags(every)
    attempted = {flag_name(str(a.get("flag", ""))) for n, _, a in returns if n == "research_flag"}
    slots = next((c.get("trials_left") for c in cands if isinstance(c, dict)), None)
    research = could_come_first(cands, verdicts, tried, attempted, slots)
    if research:
        from pydantic_ai.messages import ModelResponse, ToolCallPart

        parts = [ToolCallPart("research_flag", {"flag": flag}) for flag in research]
        return ModelResponse(parts=parts, model_name="builtin")
    return say(first_pick_text(cands, verdicts, tried, slots, shown=attempted, failed=attempted))


def chat_policy(messages: list[Any], info: Any) -> Any:
    """Answer the latest chat request with one tool call, then a short report of what it returned.

    One piece because it is a table of request patterns read top to bottom, the first match deciding:
    each row is a call, then a report of what the call returned, so the order of the rows is the rule.
    """
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
        from agent.policy.builtin.policy import planner_policy

        return planner_policy(messages, info)
    if _WHY_NOT.match(low):
        flag = _flag_of(re.sub(r"^why (not|didn'?t you|did you not|no)( try)?", "why", low))
        if flag is None:
            return say("why not which flag? e.g. 'why not --enable-torch-compile?'")
        if "research_flag" not in done:
            return call("research_flag", {"flag": flag})
        v = returns[-1][1]
        if not isinstance(v, dict) or v.get("error"):
            return say(_summary("research_flag", v))
        return say(_research_reply(v, why_not=True))
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
        if "deployed_now" not in done:  # a change already deployed is answered before any research
            return call("deployed_now", {"changes": [change]})
        held = _last(returns, "deployed_now").get("already_deployed")
        if held:
            return say(_already_reply(held, _last(returns, "deployed_now")))
        researched = change["flag"] in _researched(messages)
        if not researched and "research_flag" not in done:
            return call("research_flag", {"flag": change["flag"]})
        trials = [c for n, c, _ in returns if n == "run_trial"]
        if not trials:
            return call("run_trial", args)
        return say(_summary("run_trial", trials[-1]))  # the research verdict, if any, is shown above
    if _DEPLOYED.search(low):
        if "deployed_now" not in done:
            return call("deployed_now", {})
        return say("\n".join(deployed_lines(_last(returns, "deployed_now"))))
    if _FIRST.search(low) and not _CANDIDATES.search(low):
        return _first_pick(messages, returns, done, call, say)
    if _CANDIDATES.search(low) or _FIRST.search(low):
        if "list_candidates" not in done:
            return call("list_candidates", {})
        return say(_summary("list_candidates", returns[-1][1]))
    if re.match(r"^(bench|benchmark|measure)", low):
        return (
            call("benchmark", {}) if "benchmark" not in done else say(_summary("benchmark", returns[-1][1]))
        )
    if re.match(r"^(roll ?back|undo|revert|go back)", low):
        return call("undo_last_kept", {}) if "undo_last_kept" not in done else say(_text(returns[-1][1]))
    if "todo" in low or low.startswith(("plan", "list")):
        return call("show_todo", {}) if "show_todo" not in done else say(_text(returns[-1][1]))
    if re.match(r"^(status|how are we|where are we)", low):
        return (
            call("show_status", {})
            if "show_status" not in done
            else say(_summary("show_status", returns[-1][1]))
        )
    return say(HELP)
