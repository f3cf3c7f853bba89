"""The planner's visible todo list: items, their states, and how they are shown."""

from __future__ import annotations

from typing import Literal

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

    def render(self) -> str:
        """Rich markup of the list, one item a line."""
        lines = []
        for item in self.items:
            style = _STYLE[item.status]
            text = f"{escape(_MARK[item.status])} {escape(item.content)}  [dim]({item.priority})[/]"
            lines.append(f"[{style}]{text}[/]" if style else text)
        return "\n".join(lines) or "(empty)"
