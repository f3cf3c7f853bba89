"""Tool errors go back to the model, bounded: a mistyped path is a retry, not the end of a run.

A tool that raises (a refused path, a bad regex, a damaged index) is answered with a pydantic-ai
`ModelRetry` carrying the reason, up to `per_tool` times per tool; after that with `ToolFailed` (the
model sees the failure and is told to stop repeating it; no retry budget is spent, so the run does
not end on it). Past `per_run` errors in all, planner and researchers together, the run stops
cleanly on that limit (`ToolErrorLimit`), like any other budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic_ai import RunContext

PER_TOOL = 3
PER_RUN = 30


class ToolErrorLimit(Exception):
    """The run's budget of tool errors is spent: the run ends on its own limit."""


@dataclass
class ErrorBudget:
    """Tool errors so far in one run (shared by the planner and its researchers)."""

    per_tool: int = PER_TOOL
    per_run: int = PER_RUN
    spent: int = 0
    by_tool: dict[str, int] = field(default_factory=dict)

    def charge(self, tool: str) -> int:
        """Count one error of `tool`; returns how many that tool has had. Raises `ToolErrorLimit`."""
        self.spent += 1
        self.by_tool[tool] = self.by_tool.get(tool, 0) + 1
        if self.spent > self.per_run:
            raise ToolErrorLimit(f"{self.spent} tool errors in this run (limit {self.per_run})")
        return self.by_tool[tool]


_PASS_THROUGH: tuple[type[BaseException], ...] = (ToolErrorLimit,)


def passes_through(error: BaseException) -> bool:
    """Errors that end the run on its own limits (token and request budgets, this module's own)."""
    from pydantic_ai.exceptions import UsageLimitExceeded

    return isinstance(error, _PASS_THROUGH + (UsageLimitExceeded,))


def ToolErrors() -> Any:  # noqa: N802 - a capability instance, named like the class it builds
    """A pydantic-ai capability: a tool's exception becomes a retry the model reads (see module doc).

    The budget is `ctx.deps.errors` (an `ErrorBudget`); deps without one get a fresh budget per call,
    so the hooks take the run context of any deps (the planner's, a researcher's).
    """
    from pydantic_ai.capabilities.abstract import AbstractCapability
    from pydantic_ai.exceptions import ModelRetry, ToolFailed

    class _ToolErrors(AbstractCapability):
        async def on_tool_execute_error(
            self, ctx: RunContext[object], *, call: Any, tool_def: Any, args: Any, error: Exception
        ) -> Any:
            if passes_through(error):
                raise error
            budget = getattr(ctx.deps, "errors", None) or ErrorBudget()
            n = budget.charge(tool_def.name)
            why = f"{tool_def.name} failed: {type(error).__name__}: {error}"
            if n > budget.per_tool:
                raise ToolFailed(
                    f"{why}. This tool has failed {n} times in this run: do not repeat the call; "
                    "use what you have or another tool."
                )
            raise ModelRetry(f"{why}. Correct the arguments (or use another tool) and call again.")

        async def on_tool_validate_error(
            self, ctx: RunContext[object], *, call: Any, tool_def: Any, args: Any, error: Exception
        ) -> Any:
            budget = getattr(ctx.deps, "errors", None) or ErrorBudget()
            n = budget.charge(tool_def.name)
            if n > budget.per_tool:
                raise ToolFailed(
                    f"the arguments of {tool_def.name} were invalid {n} times in this run ({error}); "
                    "do not repeat the call."
                )
            raise error

    return _ToolErrors()
