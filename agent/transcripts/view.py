"""A saved conversation rendered for people: numbered messages, folded tool calls, subagents
indented under the call that spawned them, todo lists and trial tables (rich renderables)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from agent.transcripts.before_after import BeforeAfter
from agent.transcripts.bundles import from_dict
from agent.transcripts.load import LoadedTranscript
from agent.transcripts.markdown import context_lines, todo_lines, trial_table
from agent.transcripts.review import (
    before_after,
    decision_of,
    find_sweeps,
    level_means,
    trial_record,
    verdict_record,
)


def fold(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, keeping its head and tail."""
    text = text.strip()
    if limit <= 0 or len(text) <= limit:
        return text
    keep = max(limit // 2, 20)
    return f"{text[:keep]} … [{len(text) - 2 * keep} chars folded] … {text[-keep:]}"


def rounded(value: Any) -> Any:
    """`value` with every float rounded as a person reads it (four significant digits, at most
    one decimal from 1000 up): `2470.121002707761` -> `2470.1`, `1.0667476760695331` -> `1.067`."""
    if isinstance(value, float):
        return round(value, 1) if abs(value) >= 1000 else float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(rounded(value), ensure_ascii=False, default=str)


def readable(value: Any) -> str:
    """A recorded value as a person reads it: `key: value; key: value` for a mapping (a server
    flag without a value as its name alone, an empty value left out), items joined by commas,
    floats rounded (`rounded`). A Python dict or list repr that an older version saved as text
    (`"{'target': 'local', ...}"`) is read back and shown the same way."""
    if isinstance(value, str):
        parsed = _literal(value)
        if parsed is None:
            return value
        value = parsed
    if isinstance(value, dict):
        parts = []
        for k, v in value.items():
            if v is None and str(k).startswith("--"):
                parts.append(str(k))
            elif v not in (None, "", [], {}):
                sep = " " if str(k).startswith("--") else ": "
                inner = readable(v)
                parts.append(f"{k}{sep}({inner})" if isinstance(v, dict) else f"{k}{sep}{inner}")
        return "; ".join(parts)
    if isinstance(value, list):
        return ", ".join(readable(v) for v in value)
    return str(rounded(value))


def _literal(text: str) -> Any:
    """A dict or list written as its Python repr, read back safely (None for any other text)."""
    import ast

    stripped = text.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")) and not (
        stripped.startswith("[") and stripped.endswith("]")
    ):
        return None
    try:
        value = ast.literal_eval(stripped)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict | list) else None


def part_lines(part: dict[str, Any], *, limit: int) -> list[Text]:
    """One pydantic-ai part as a few styled lines."""
    kind = part.get("part_kind", "?")
    if kind == "tool-call":
        args = fold(_compact(part.get("args") or {}), limit // 2)
        return [Text.assemble(("→ ", "cyan"), (str(part.get("tool_name")), "bold cyan"), f"({args})")]
    if kind in ("tool-return", "builtin-tool-return"):
        body = fold(_compact(part.get("content")), limit)
        return [Text.assemble(("← ", "green"), (str(part.get("tool_name")), "green"), ": ", body)]
    if kind == "retry-prompt":
        return [Text.assemble(("↻ retry: ", "yellow"), fold(_compact(part.get("content")), limit))]
    if kind == "thinking":
        return [Text(fold(str(part.get("content", "")), limit), style="dim italic")]
    style = {"system-prompt": "dim", "user-prompt": "bold"}.get(kind, "")
    return [Text(fold(_compact(part.get("content", "")), limit), style=style)]


def message_block(m: dict[str, Any], *, limit: int) -> RenderableType:
    """`[msg N] agent · role` and its parts."""
    ts = str(m.get("ts", ""))[11:19]
    head = Text.assemble(
        (f"[msg {m.get('msg')}]", "bold magenta"), f" {m.get('agent', '?')} · {m.get('role', '?')}"
    )
    if ts:
        head.append(f"  {ts}", style="dim")
    usage = m.get("usage") or {}
    if usage.get("input_tokens") or usage.get("output_tokens"):
        head.append(f"  tokens {usage.get('input_tokens', 0)}→{usage.get('output_tokens', 0)}", style="dim")
    lines: list[RenderableType] = [head]
    lines += [
        Padding(line, (0, 0, 0, 2), expand=False)
        for p in m.get("parts", [])
        for line in part_lines(p, limit=limit)
    ]
    return Group(*lines)


def _md_table(lines: list[str]) -> Table | None:
    if len(lines) < 3:
        return None
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]
    table = Table(*rows[0], box=None, padding=(0, 2), header_style="bold")
    for row in rows[2:]:
        table.add_row(*row)
    return table


def evidence_text(evidence: str, limit: int) -> Text:
    """`path:line quote` with the path always whole (it is what a reader opens); only the quote folds."""
    where, _, quote = evidence.partition(" ")
    text = Text(where, style="cyan", no_wrap=False, overflow="fold")
    if quote:
        text.append(" " + fold(quote, max(limit - len(where), 40)), style="dim")
    return text


def event_block(
    e: dict[str, Any],
    *,
    baseline: dict[int, float | None],
    limit: int,
    user_workload: BeforeAfter | None = None,
) -> RenderableType:
    """A recorded event: todo list, verdict, trial table, or a one-line summary. A `final` event
    with its `user_workload` (`review.before_after`) reads as the report's and the review's
    section: before and after per level, each change with its interval, and how far that goes."""
    kind, data = e.get("kind", "?"), e.get("data") or {}
    label = Text(f"● {kind}", style="bold yellow")
    if kind == "todo":
        items = data.get("items", data.get("todos")) if isinstance(data, dict) else data
        groups = [from_dict(g) for g in (data.get("together") or [] if isinstance(data, dict) else [])]
        lines = todo_lines([i for i in items or [] if isinstance(i, dict)], groups)
        body = [Text(line[2:] if line.startswith("- ") else "    " + line.lstrip()) for line in lines]
        return Group(
            label.append(" list", style="bold yellow"),
            *[Padding(b, (0, 0, 0, 2), expand=False) for b in body],
        )
    if kind == "verdict":
        v = verdict_record(data)
        text = Text.assemble(label, f" {v['flag']}: ", (v["verdict"], "bold"))
        rest = [Padding(evidence_text(ev, limit), (0, 0, 0, 2), expand=False) for ev in v["evidence"][:3]]
        return Group(text, *rest)
    if kind == "trial":
        t = trial_record(0, e, baseline)
        style = {"kept": "bold green", "rolled back": "bold red"}.get(decision_of(data), "bold")
        change = t.change
        if data.get("kind") in ("bundle", "combined") and ", " in change:  # one effect for all of them
            change = "together: " + change.replace(", ", " + ")
        head = Text.assemble(label, f" {change}: ", (t.decision, style), f"  {fold(t.reason, limit)}")
        table = _md_table(trial_table(t))
        return Group(head, Padding(table, (0, 0, 0, 2), expand=False)) if table else head
    if kind == "context" and isinstance(data, dict):
        lines = [Text(line[2:]) for line in context_lines(data)]
        return Group(label, *[Padding(line, (0, 0, 0, 2), expand=False) for line in lines])
    if (
        kind == "final" and user_workload is not None
    ):  # the configuration left deployed, on the user's workload
        md = user_workload.markdown()
        table = _md_table([line for line in md if line.startswith("|")])
        said = [Text(md[0]), *([table] if table else []), *([Text(md[-1])] if len(md) > 1 else [])]
        return Group(label, *[Padding(r, (0, 0, 0, 2), expand=False) for r in said])
    if kind in ("baseline", "final"):
        tp = level_means(find_sweeps(data))
        nums = "  ".join(
            f"c{c}: {v:,.1f} tok/s" if v is not None else f"c{c}: missing" for c, v in tp.items()
        )
        return Text.assemble(label, f" {nums or fold(_compact(data), limit)}")
    if isinstance(data, dict) and isinstance(data.get("text"), str):  # the event's own words
        return Text.assemble(label, " ", fold(data["text"], limit))
    return Text.assemble(label, " ", fold(readable(data), limit))


def _children(loaded: LoadedTranscript) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    numbers = {m["msg"] for m in loaded.messages}
    top, children = [], {}
    for m in loaded.messages:
        if m.get("parent") in numbers and m.get("parent") != m["msg"]:
            children.setdefault(m["parent"], []).append(m)
        else:
            top.append(m)
    return top, children


def render_conversation(
    loaded: LoadedTranscript, *, focus: int | None = None, context: int = 2, limit: int = 400
) -> Iterator[RenderableType]:
    """The whole session in order, or only messages `focus - context .. focus + context`."""
    baseline = level_means([s for e in loaded.events_of("baseline") for s in find_sweeps(e.get("data"))])
    # a run records `final` only when it kept something: each against the first baseline
    finals = {id(e): before_after(loaded, kept=True, final=e) for e in loaded.events_of("final")}
    by_msg: dict[int, list[dict[str, Any]]] = {}
    loose: list[dict[str, Any]] = []
    numbers = {m["msg"] for m in loaded.messages}
    for e in loaded.events:
        (by_msg.setdefault(e["msg"], []) if e.get("msg") in numbers else loose).append(e)
    lo, hi = (focus - context, focus + context) if focus is not None else (None, None)

    def shown(m: dict[str, Any]) -> bool:
        return lo is None or lo <= m["msg"] <= hi

    def block(m: dict[str, Any], depth: int) -> Iterator[RenderableType]:
        if shown(m):
            yield Padding(message_block(m, limit=limit), (0, 0, 0, 4 * depth), expand=False)
            for e in by_msg.get(m["msg"], []):
                shown_e = event_block(e, baseline=baseline, limit=limit, user_workload=finals.get(id(e)))
                yield Padding(shown_e, (0, 0, 0, 4 * depth + 2), expand=False)
        for child in children.get(m["msg"], []):
            yield from block(child, depth + 1)

    top, children = _children(loaded)
    events = sorted(loose, key=lambda e: str(e.get("ts", "")))
    for m in top:
        while focus is None and events and str(events[0].get("ts", "")) <= str(m.get("ts", "")):
            e = events.pop(0)
            yield event_block(e, baseline=baseline, limit=limit, user_workload=finals.get(id(e)))
        yield from block(m, 0)
    for e in events if focus is None else []:
        yield event_block(e, baseline=baseline, limit=limit, user_workload=finals.get(id(e)))


def terminal_markdown(text: str) -> Any:
    """`text` as a rich Markdown renderable whose tables fold long cells (a flag name breaks onto
    the next line) instead of cutting them with an ellipsis at 80 columns."""
    from rich.markdown import Markdown, TableElement

    class FoldingTable(TableElement):
        def __rich_console__(self, console: Any, options: Any) -> Any:
            for table in super().__rich_console__(console, options):
                for column in table.columns:
                    column.overflow = "fold"
                yield table

    class FoldingMarkdown(Markdown):
        elements = {**Markdown.elements, "table_open": FoldingTable}

    return FoldingMarkdown(text)
