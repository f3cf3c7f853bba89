"""The planner's visible todo list: items, their states, and how they are shown."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field
from rich.markup import escape

Status = Literal["pending", "in_progress", "completed", "cancelled"]
_MARK = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]", "cancelled": "[-]"}
_STYLE = {"pending": "", "in_progress": "bold yellow", "completed": "green", "cancelled": "dim strike"}


class TodoItem(BaseModel):
    """One line of the todo list."""

    id: str = Field(description="short stable id, e.g. 'fused-moe'")
    content: str = Field(description="what to do, one line")
    status: Status = "pending"
    priority: Literal["high", "medium", "low"] = "medium"


class TodoList(BaseModel):
    """The whole list; `todo_write` replaces it and the change is shown and recorded."""

    items: list[TodoItem] = Field(default_factory=list)

    def replace(self, items: list[TodoItem]) -> list[str]:
        """Take the new list; return a line per change (`+ added`, `~ status`), for display."""
        old = {i.id: i for i in self.items}
        changes = []
        for item in items:
            before = old.get(item.id)
            if before is None:
                changes.append(f"+ {item.content} ({item.status}, {item.priority})")
            elif before.status != item.status or before.content != item.content:
                changes.append(f"~ {item.content}: {before.status} -> {item.status}")
        for gone in set(old) - {i.id for i in items}:
            changes.append(f"- {old[gone].content}")
        self.items = list(items)
        return changes

    def render(self, entries: Sequence[Any] | None = None) -> str:
        """Rich markup of the list, one item a line (`blocks`, joined)."""
        return "\n".join(self.blocks(entries)) or "(empty)"

    def blocks(self, entries: Sequence[Any] | None = None) -> list[str]:
        """Rich markup of each entry of the list. `entries`: the list as grouped for display
        (`agent.transcripts.bundles.group_todo`): an item, or a trial of several flags as one change
        (`Together`) shown as one entry, its one measured effect, with a line per member (its
        research, and that its own effect was not measured separately)."""
        out = []
        for entry in self.items if entries is None else entries:
            if isinstance(entry, TodoItem):
                out.append(_line(entry.status, entry.content, entry.priority))
            elif isinstance(entry, Mapping):
                out.append(_line(entry["status"], entry["content"], entry["priority"]))
            else:  # a Together with the priority of its first member's item
                t, priority = entry
                status = "cancelled" if t.decision == "skipped" else "completed"
                members = [f"    [dim]{escape(line)}[/]" for line in t.member_lines()]
                out.append("\n".join([_line(status, t.title(), priority), *members]))
        return out


def _line(status: str, content: str, priority: str) -> str:
    style = _STYLE.get(status, "")
    text = f"{escape(_MARK.get(status, '[ ]'))} {escape(content)}  [dim]({priority})[/]"
    return f"[{style}]{text}[/]" if style else text
