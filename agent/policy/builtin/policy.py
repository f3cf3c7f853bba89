"""The builtin offline policy: pydantic-ai `FunctionModel`s for the planner and the researcher.

Explicit rules over the same tools an LLM gets: the playbook checked against the real facts, the
researcher's verdict from the real code search (dead when nothing reads the flag, no-op when every
reader's guard fails here), and the measured trial results. Each function reads only the message
history, so a run can be replayed and resumed like an LLM's.
"""

from __future__ import annotations

import re
from typing import Any

from agent.policy.builtin.conclusion import conclusion
from agent.policy.builtin.messages import builtin_response, tool_call, tool_returns
from agent.policy.builtin.research import decide_verdict
from agent.policy.trialqueue import doubtful_members, next_trials
from agent.policy.verdict import doubtful_rejection, final_rejection
from tools.flagname import flag_name

_FLAG = re.compile(r"--[A-Za-z0-9][\w-]*(?:\.[\w-]+)*")
_ORDER = {"high": 0, "medium": 1, "low": 2}
_RESEARCHED = ("candidate", "no-op", "incompatible")
"""Playbook statuses still worth a code check (already-set and not-in-version are not)."""


# ---- researcher ---------------------------------------------------------------------------------


def researcher_policy(messages: list[Any], info: Any) -> Any:
    """Look the flag up and read its usage, then decide from what the code search returned."""
    first = messages[0]
    prompt = " ".join(str(getattr(p, "content", "")) for p in first.parts)
    flag = (_FLAG.findall(prompt) or ["--unknown"])[0]
    got = {name: content for name, content, _ in tool_returns(messages)}
    if "lookup" not in got:
        return builtin_response([tool_call("lookup", {"flag": flag}), tool_call("usage", {"flag": flag})])
    verdict = decide_verdict(flag, got["lookup"], got.get("usage") or {})
    return builtin_response([tool_call(info.output_tools[0].name, verdict)])


# ---- planner ------------------------------------------------------------------------------------


def _todo(
    cands: list[dict[str, Any]], verdicts: dict[str, dict], trials: dict[str, dict], extra: list[dict],
    unresearched: dict[str, str] | None = None,
) -> list:  # fmt: skip
    """The todo list the builtin planner writes: one item per candidate, then `extra`. One piece
    because it is one ladder of rules per candidate read top to bottom (ruled out by the playbook,
    tried, unresearched (`unresearched`: never, the deadline came first), rejected, lossy, else
    pending), the first match giving the item."""
    items = []
    for c in cands:
        flag, prio = c["flag"], c["priority"]
        label = c["flag"] if c["value"] is None else f"{c['flag']} {c['value']}"
        if c["status"] not in _RESEARCHED:  # a playbook no-op is still researched: the code decides
            items.append(
                {
                    "id": flag,
                    "content": f"{label}: ruled out ({c.get('ruled_out') or c['status'] + ': ' + c['note']})",
                    "status": "cancelled",
                    "priority": prio,
                }
            )
            continue
        v, t = verdicts.get(flag), trials.get(flag)
        if t is not None:
            label = f"{flag} {_value_tried(c, t)}" if c["value"] is not None else label
            status = "completed" if t.get("decision") else "cancelled"
            what = t.get("decision") or ("dry run" if t.get("dry_run") else "not run")
            why = t.get("why") or t.get("error") or t.get("note", "")  # a dry run: "nothing deployed"
            others = [c for c in t.get("changes") or [] if c.split()[0] != flag]
            if t.get("kind") in ("bundle", "combined") and others:  # one effect for all, not this flag's
                what += f" together with {', '.join(others)} in trial {t.get('trial')}"
            items.append(
                {
                    "id": flag,
                    "content": f"trial {label}: {what}" + (f" — {why}" if why else ""),
                    "status": status,
                    "priority": prio,
                }
            )
        elif v is None and flag in (unresearched or {}):
            items.append(
                {
                    "id": flag,
                    "content": f"{label}: {unresearched[flag]}",
                    "status": "cancelled",
                    "priority": prio,
                }
            )
        elif v is None:
            items.append(
                {"id": flag, "content": f"research {label}", "status": "in_progress", "priority": prio}
            )
        elif final_rejection(v):
            items.append(
                {
                    "id": flag,
                    "content": f"{label}: {v['verdict']} — {v['summary']}",
                    "status": "cancelled",
                    "priority": prio,
                }
            )
        elif lossy_blocked(c, v):
            items.append(
                {
                    "id": flag,
                    "content": f"{label}: skipped — lossy (changes outputs), --allow-lossy not given",
                    "status": "cancelled",
                    "priority": prio,
                }
            )
        else:
            items.append(
                {
                    "id": flag,
                    "content": f"trial {label} (research: {v['verdict']})",
                    "status": "pending",
                    "priority": prio,
                }
            )
    return items + extra


def planner_policy(messages: list[Any], info: Any) -> Any:
    """Candidates → todo list → research all (concurrently) → trials in order → combined → conclusion.

    One piece because the next step is a ladder read top to bottom (todo and research, a leave-out,
    the queue's next trial or bundle, the combined trial, the final todo, the conclusion), every rung
    reading the state folded from the tool returns at the top.
    """
    returns = tool_returns(messages)
    cands = next((c for n, c, _ in returns if n == "list_candidates"), None)
    if cands is None:
        return builtin_response([tool_call("list_candidates", {})])
    live = live_candidates(cands)
    verdicts = {
        c["flag"]: c for n, c, _ in returns if n == "research_flag" and isinstance(c, dict) and "verdict" in c
    }
    unresearched = {  # the deadline came before their research: no verdict, and none half-written
        c["flag"]: str(c["not_researched"])
        for n, c, _ in returns
        if n == "research_flag" and isinstance(c, dict) and c.get("not_researched")
    }
    trials: dict[str, dict] = {}
    tried: dict[str, list[dict]] = {}
    combined = None
    budget_out: str | None = None
    bundles: list[tuple[list[str], dict]] = []
    left_out: dict[str, dict] = {}
    # the trials the budget still fits, as the latest trial result (else the candidate list) says
    slots: float | None = next((c.get("trials_left") for c in cands if isinstance(c, dict)), None)
    for name, content, args in returns:
        if name not in ("run_trial", "leave_out") or not isinstance(content, dict):
            continue
        slots = content.get("trials_left", slots)
        if content.get("budget_exhausted"):
            budget_out = str(content.get("error") or "budget exhausted")
            continue
        if content.get("halted"):
            budget_out = str(content["halted"])
        if name == "leave_out":
            left_out[flag_name(str(args.get("flag", "")))] = content
            continue
        flags = [ch["flag"] for ch in args.get("changes", [])]
        if args.get("together_reason"):  # a bundle: each member counts as tried
            members = [flag_name(f) for f in flags]
            bundles.append((members, content))
            for f in members:
                trials[f] = content
                tried.setdefault(f, []).append(content)
        elif len(flags) > 1:
            combined = content
        elif flags:
            value = args["changes"][0].get("value")
            content = {**content, "value": value, "size": _number(value)}
            trials[flag_name(flags[0])] = content
            tried.setdefault(flag_name(flags[0]), []).append(content)
    extra = [
        {
            "id": "combine",
            "content": "trial the kept flags together",
            "status": "pending",
            "priority": "medium",
        }
    ]
    if not any(n == "todo_write" for n, _, _ in returns):
        todo = _todo(cands, verdicts, trials, extra, unresearched)
        research = [tool_call("research_flag", {"flag": c["flag"]}) for c in live]
        return builtin_response([tool_call("todo_write", {"items": todo}), *research])
    # a kept bundle first loses the members that cannot show they pay (one leave-out trial each)
    prune = None if budget_out else _next_leave_out(cands, verdicts, bundles, left_out)
    if prune is not None:
        flag, why = prune
        todo = _todo(cands, verdicts, trials, extra, unresearched)
        return builtin_response(
            [tool_call("todo_write", {"items": todo}), tool_call("leave_out", {"flag": flag, "reason": why})]
        )
    # highest expected value per restart first (research certainty x plausible gain / restart cost);
    # a near miss may get a second look, ranked by what was measured; small levers as one bundle
    queue = trial_queue(cands, verdicts, tried, slots)
    nxt, look = (None, "") if budget_out or not queue else queue[0]
    if nxt is not None and "bundle" in nxt:
        todo = _todo(cands, verdicts, trials, extra, unresearched)
        members = nxt["bundle"]
        for item in todo:
            if item["id"] in {c["flag"] for c in members}:
                item["status"] = "in_progress"
                others = [c["flag"] for c in members if c["flag"] != item["id"]]
                item["content"] += f", as one change with {', '.join(others)}"
        changes = [{"flag": c["flag"], "value": c["value"], "action": c["action"]} for c in members]
        args = {"changes": changes, "reason": nxt["together"], "together_reason": look}
        if any(verdicts[c["flag"]]["verdict"] == "unknown" for c in members):
            args["override_reason"] = (
                "the code search was inconclusive but the playbook's conditions hold here"
            )
        return builtin_response([tool_call("todo_write", {"items": todo}), tool_call("run_trial", args)])
    if nxt is not None:
        todo = _todo(cands, verdicts, trials, extra, unresearched)
        for item in todo:
            if item["id"] == nxt["flag"]:
                item["status"] = "in_progress"
        change = {"flag": nxt["flag"], "value": nxt["value"], "action": nxt["action"]}
        v = verdicts[nxt["flag"]]
        reason = f"research: {v['verdict']} — {v['summary']}; playbook: {nxt['helps']}"
        if nxt.get("sized"):  # the next value of a sized lever: what the values tried leave room for
            reason = look
        elif nxt["flag"] in tried:  # a near miss: say what the first trial measured
            reason = f"{look}: {tried[nxt['flag']][-1].get('why')}"
        args = {"changes": [change], "reason": reason}
        if v["verdict"] == "unknown":
            args["override_reason"] = (
                "the code search was inconclusive but the playbook's conditions hold here"
            )
        return builtin_response([tool_call("todo_write", {"items": todo}), tool_call("run_trial", args)])
    # each trial runs on top of the changes kept so far, so kept ones are already combined; what
    # improved alone but is not deployed gets one trial together with the deployed best
    kept = [t for t in trials.values() if t.get("improved") and t.get("decision") != "kept"]
    if kept and combined is None and not budget_out:
        changes = [c for c in live if c["flag"] in trials and trials[c["flag"]].get("improved")]
        extra[0]["status"] = "in_progress"
        value = {c["flag"]: _value_tried(c, trials[c["flag"]]) for c in changes}
        args = {
            "changes": [
                {"flag": c["flag"], "value": value[c["flag"]], "action": c["action"]} for c in changes
            ],
            "reason": "check that the gains of the flags kept individually add up",
        }
        return builtin_response(
            [
                tool_call("todo_write", {"items": _todo(cands, verdicts, trials, extra, unresearched)}),
                tool_call("run_trial", args),
            ]
        )
    if not _final_todo_written(messages):
        extra[0]["status"] = "completed" if combined else "cancelled"
        extra[0]["content"] = "trial the kept flags together" + (
            f": {combined.get('decision')} — {combined.get('why')}"
            if combined
            else ": nothing left to combine (each trial ran on top of the changes kept before it)"
        )
        return builtin_response(
            [tool_call("todo_write", {"items": _todo(cands, verdicts, trials, extra, unresearched)})]
        )
    from pydantic_ai.messages import TextPart

    untried = {c["flag"]: i + 1 for i, (c, why) in enumerate(queue) if why == "untried"}
    earlier = [t for ts in tried.values() for t in ts[:-1]] + list(left_out.values())
    return builtin_response(
        [TextPart(conclusion(cands, verdicts, trials, combined, budget_out, untried, earlier, unresearched))]
    )


def _next_leave_out(
    cands: list[dict[str, Any]], verdicts: dict[str, dict], bundles: list[tuple[list[str], dict]],
    left_out: dict[str, dict],
) -> tuple[str, str] | None:  # fmt: skip
    """(flag, why) of the next doubtful member of the latest kept bundle not yet left out."""
    kept = [(m, t) for m, t in bundles if t.get("decision") == "kept"]
    if not kept:
        return None
    members, result = kept[-1]
    by_flag = {c["flag"]: c for c in cands}
    doubtful = doubtful_members(
        [by_flag[f] for f in members if f in by_flag], verdicts, result.get("won_at") or []
    )
    for c, why in doubtful:
        if c["flag"] not in left_out:
            return c["flag"], f"doubtful member of the bundle kept in trial {result.get('trial')}: {why}"
    return None


def live_candidates(cands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Candidates worth a code check, lossless first, then by the playbook's priority."""
    return sorted(
        (c for c in cands if c["status"] in _RESEARCHED),
        key=lambda c: (c["lossy"], _ORDER.get(c["priority"], 3)),
    )


def trial_queue(
    cands: list[dict[str, Any]],
    verdicts: dict[str, dict],
    tried: dict[str, list[dict]],
    slots: float | None = None,
) -> list[tuple[dict[str, Any], str]]:
    """What the builtin planner trials next, best first: (candidate, why), see `agent.policy.trialqueue`;
    `slots`: the trials the budget still fits (None: not known yet)."""
    worth = [
        c
        for c in live_candidates(cands)
        if _worth(verdicts.get(c["flag"])) and not lossy_blocked(c, verdicts.get(c["flag"]))
    ]
    return next_trials(worth, verdicts, tried, slots)


def _worth(v: dict[str, Any] | None) -> bool:
    return v is not None and (v["verdict"] in ("applies", "unknown") or doubtful_rejection(v))


def lossy_blocked(cand: dict[str, Any], v: dict[str, Any] | None) -> bool:
    """Lossy by the playbook or the research, and the user did not allow lossy changes."""
    lossy = cand.get("lossy") or bool((v or {}).get("lossy"))
    return bool(lossy) and not cand.get("lossy_allowed", False)


def _number(value: Any) -> float | None:
    """A flag value as a number (a sized lever's value), None when it is not one."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _value_tried(cand: dict[str, Any], trial: dict[str, Any]) -> Any:
    """The value a candidate's latest trial alone set (a sized lever's search moves it), else the
    playbook's."""
    return trial.get("value") if trial.get("value") is not None else cand["value"]


def _final_todo_written(messages: list[Any]) -> bool:
    from pydantic_ai.messages import ModelResponse, ToolCallPart

    for m in reversed(messages):
        if isinstance(m, ModelResponse):
            for p in m.parts:
                if isinstance(p, ToolCallPart) and p.tool_name == "todo_write":
                    items = p.args_as_dict().get("items", [])
                    return any(
                        i.get("id") == "combine" and i.get("status") in ("completed", "cancelled")
                        for i in items
                    )
            return False
    return False
