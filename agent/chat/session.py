"""`optagent chat`: one planner turn per user line, with an approval step before the target changes.

The planner and its tools are the run's own (`agent.policy.planner`); chat adds three tools (`show_todo`,
`deployed_now`, `undo_last_kept`), an approval gate (a pydantic-ai capability that makes target-changing tools
approval-required and asks the user, showing the unit-file diff), slash commands, and Ctrl-C
handling that cancels the step and leaves the target on its known-good configuration. Imports
pydantic-ai: import this module only in the chat command.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic_ai import RunContext
from rich.console import Console
from rich.markup import escape

from agent.chat import actions, deployed
from agent.chat.actions import change_in_words, previous_best
from agent.chat.needs import ApprovalGate
from agent.live import held
from agent.policy.planner import PlannerDeps  # evaluated: pydantic-ai reads the chat tools' `RunContext[...]`
from agent.trial.record import TrialChange

if TYPE_CHECKING:
    from agent.trial.runner import TrialRunner

SLASH_HELP = """\
/todo      the planner's todo list
/status    deployed flags, health, trials, last benchmark
/bench     benchmark the deployed configuration now
/rollback  undo the last kept change (asks first)
/save      where the session is saved and how to resume it
/help      this help
/exit      leave (Ctrl-D too); Ctrl-C interrupts the current step"""

BARE_COMMANDS = {"status": "/status", "todo": "/todo", "exit": "/exit", "quit": "/quit"}
"""A slash command's name typed without the slash is that command: `status` was a planner turn whose
reply differed from `/status` (and, through the builtin policy, was once raw JSON)."""

Ask = Callable[[str], Awaitable[str | None]]


def line_reader(console: Console, *, history_file: str | None = None) -> Ask:
    """prompt_toolkit (editing, history) on a terminal; plain line reading when stdin is piped."""
    if sys.stdin.isatty():
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory

        session: Any = PromptSession(history=FileHistory(history_file) if history_file else InMemoryHistory())

        async def ask_tty(prompt: str) -> str | None:
            try:
                return await session.prompt_async(prompt)
            except EOFError:
                return None

        return ask_tty

    async def ask_pipe(prompt: str) -> str | None:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return None
        console.print(f"{prompt}{line.rstrip()}", highlight=False, markup=False)
        return line.rstrip("\n")

    return ask_pipe


def target_text(runner: TrialRunner | None, tool: str, args: dict[str, Any]) -> str | None:
    """The unit file text a target-changing tool call would deploy (None when unknown)."""
    from agent.trial.record import TrialChange, apply_changes

    if runner is None:
        return None
    if tool == "run_trial":
        try:
            changes = [TrialChange.model_validate(c) for c in args.get("changes", [])]
            return apply_changes(runner.deployed_text, changes)  # trials stack on the kept changes
        except Exception:
            return None
    if tool == "undo_last_kept":
        prev = previous_best(runner)
        return (
            runner.baseline.text if prev is None else apply_changes(runner.baseline.text, prev.full_changes())
        )
    return None


@dataclass
class ChatSession:
    """The state of one chat: the planner, its deps, the history, the transcript and the console."""

    planner: Any
    deps: PlannerDeps
    transcript: Any
    console: Console
    ask: Ask
    yes: bool = False
    instructions: str | None = None
    history: list[Any] = field(default_factory=list)
    capabilities: list[Any] = field(default_factory=list)
    step: asyncio.Task | None = None
    """The step Ctrl-C cancels (see `interruptible`)."""

    def __post_init__(self) -> None:
        from pydantic_ai.capabilities import HandleDeferredToolCalls

        add_chat_tools(self.planner)
        self.capabilities = [ApprovalGate(), HandleDeferredToolCalls(handler=self._approve)]

    @property
    def runner(self) -> TrialRunner | None:
        return self.deps.runner

    async def _approve(self, ctx: RunContext[PlannerDeps], requests: Any) -> Any:
        from pydantic_ai.tools import ToolDenied

        answers = {}
        for call in requests.approvals:
            args = call.args_as_dict()
            ok = await self.confirm(call.tool_name, args)
            answers[call.tool_call_id] = (
                True if ok else ToolDenied("the user declined; the target was not changed")
            )
        return requests.build_results(approvals=answers)

    async def confirm(self, tool: str, args: dict[str, Any]) -> bool:
        """Show the diff of what `tool` would deploy and ask; recorded as an `approval` event."""
        from tools.deploy.units.file import unified_diff

        new = target_text(self.runner, tool, args)
        old = self.runner.deployed_text if self.runner is not None else None
        diff = unified_diff(old, new, name="sglang.service") if old is not None and new is not None else ""
        what = change_in_words(self.runner, tool, args)
        self.console.print(f"[bold yellow]approval needed:[/] {escape(what)}", highlight=False)
        if diff:
            from rich.syntax import Syntax

            self.console.print(Syntax(diff, "diff", theme="ansi_dark"))
        if self.yes:
            approved, by = True, "--yes"
        else:
            with held(self.console):  # no bar may draw over the question
                answer = await self.ask("apply this change to the target? [y/N] ")
            self._catch_ctrl_c()  # a terminal prompt takes SIGINT over and removes its handler after
            approved, by = (answer or "").strip().lower() in ("y", "yes"), "user"
        self.console.print("approved" if approved else "[red]declined[/]: the target is not changed")
        self.transcript.event(
            "approval",
            {
                "tool": tool,
                "what": what,
                "change": args.get("changes") or tool,
                "diff": diff,
                "approved": approved,
                "by": by,
            },
        )
        return approved

    async def turn(self, text: str) -> str | None:
        """One planner turn for a user line; messages are saved after every step."""
        from pydantic_ai.messages import ModelResponse

        saved = len(self.history)
        if hasattr(self.deps, "errors"):  # a turn is a run: its own budget of tool errors
            from agent.policy.toolerrors import ErrorBudget

            self.deps.errors = ErrorBudget()
        kwargs = {
            "deps": self.deps,
            "message_history": self.history or None,
            "capabilities": self.capabilities,
            "instructions": self.instructions,  # the planner prompt with its chat section (none was sent)
        }
        try:
            async with self.planner.iter(text, **kwargs) as run:
                async for _node in run:
                    saved = self._save(run.all_messages(), saved, ModelResponse)
                self._save(run.all_messages(), saved, ModelResponse)
                self.history = run.all_messages()
                return str(run.result.output) if run.result is not None else None
        finally:
            self._stop_bars()

    def _save(self, messages: list[Any], saved: int, response_type: type) -> int:
        new = messages[saved:]
        numbers = self.transcript.add_messages(new, agent="planner") if new else []
        for m, n in zip(new, numbers, strict=False):
            if isinstance(m, response_type):
                self.deps.current_msg = n
        return len(messages)

    async def interruptible(self, coro: Awaitable[Any]) -> Any:
        """Run a step; Ctrl-C cancels it, and the target goes back to known-good if a deploy was in flight."""
        self.step = task = asyncio.ensure_future(coro)
        self._catch_ctrl_c()
        try:
            return await task
        except asyncio.CancelledError:
            self.console.print("[yellow]interrupted[/]: cancelling the step")
            await self._settle()
            return None
        finally:
            self.step = None
            with contextlib.suppress(NotImplementedError, RuntimeError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)

    def _catch_ctrl_c(self) -> None:
        """Ctrl-C cancels the running step (again after a prompt inside it, e.g. an approval:
        prompt_toolkit installs its own SIGINT handler and removes it when the prompt returns)."""
        if self.step is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                asyncio.get_running_loop().add_signal_handler(signal.SIGINT, self.step.cancel)

    async def _settle(self) -> None:
        """Cancel what the step left running (a shielded trial rolls itself back), then make sure."""
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in others:
            t.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        if self.runner is not None:
            outcome = await self.runner.deployment.rollback()
            self.transcript.event(
                "deploy", {"action": "interrupted", "rollback_ok": getattr(outcome, "ok", True)}
            )
            self.console.print("the target is on its known-good configuration")
        self._stop_bars()

    def _stop_bars(self) -> None:
        """No progress bar of a cancelled step may keep redrawing over the prompt, nor come back
        for research a cancelled step left without a verdict."""
        ui = getattr(self.deps, "ui", None)
        if ui is not None and hasattr(ui, "end_research"):
            ui.end_research()
        if ui is not None and hasattr(ui, "stop_wait"):
            ui.stop_wait()

    async def slash(self, command: str) -> bool:
        """Run a slash command; False means leave the chat."""
        name = command.split()[0].lower()
        if name in ("/exit", "/quit"):
            return False
        if name == "/help":
            self.console.print(SLASH_HELP, highlight=False, markup=False)
        elif name == "/todo":
            self.console.print(
                self.deps.todo.render() if self.deps.todo.items else "(the todo list is empty)"
            )
        elif name == "/status":
            self.console.print(
                "\n".join(await actions.status_lines(self.deps)), highlight=False, markup=False
            )
        elif name == "/bench":
            self._say(await self.interruptible(actions.bench_now(self.deps)))
        elif name == "/rollback":  # nothing kept in this chat: no question about a change that is none
            if getattr(self.runner, "best", None) is None or await self.confirm("undo_last_kept", {}):
                self._say(await self.interruptible(actions.undo_last_kept(self.deps)))
        elif name == "/save":
            self.transcript.event("note", {"text": "saved by /save"})
            self.console.print(
                f"saved to {self.transcript.path}\nresume with: optagent chat --resume {self.transcript.id}"
            )
        else:
            self.console.print(f"unknown command {name}; /help lists them")
        return True

    def _say(self, text: str | None) -> None:
        """A result as plain text (`[--flag]` in it is no markup to drop); none after a Ctrl-C."""
        if text is not None:
            self.console.print(text, highlight=False, markup=False)

    async def loop(self) -> str:
        """Read lines until /exit or end of input; returns how the chat ended."""
        self.console.print("optagent chat — /help for commands, /exit or Ctrl-D to leave", highlight=False)
        while True:
            try:
                line = await self.ask("you> ")
            except KeyboardInterrupt:
                continue
            if line is None:
                return "end of input"
            line = line.strip()
            if not line:
                continue
            command = line if line.startswith("/") else BARE_COMMANDS.get(line.lower().rstrip("?!. "))
            if command:
                if not await self.slash(command):
                    return "exit"
                continue
            try:
                reply = await self.interruptible(self.turn(line))
            except Exception as e:  # a model that gives up, a limit: the chat goes on
                reply = None
                self.console.print(f"[red]that step failed:[/] {escape(f'{type(e).__name__}: {e}')}")
                self.transcript.event("note", {"text": f"step failed: {type(e).__name__}: {e}"})
            if reply:
                self.console.print(f"[bold cyan]optagent>[/] {escape(reply)}", highlight=False)


def add_chat_tools(planner: Any) -> None:
    """Register the chat-only tools on the planner (once)."""
    if getattr(planner, "_optagent_chat_tools", False):
        return
    planner._optagent_chat_tools = True

    @planner.tool
    async def show_todo(ctx: RunContext[PlannerDeps]) -> str:
        """The current todo list, one item a line."""
        return actions.todo_text(ctx.deps.todo)

    @planner.tool
    async def deployed_now(
        ctx: RunContext[PlannerDeps], changes: list[TrialChange] | None = None
    ) -> dict[str, Any]:
        """The flags deployed now (the host's unit file), what changed since this chat started and
        since the session before it, and whether it is the known-good on record; with `changes`,
        `already_deployed` lists those it already holds (a trial of them would restart for nothing)."""
        return await deployed.deployed_now(ctx.deps, changes)

    @planner.tool(sequential=True)
    async def undo_last_kept(ctx: RunContext[PlannerDeps]) -> str:
        """Go back to the configuration before the last kept change (the user approves the diff first)."""
        return await actions.undo_last_kept(ctx.deps)
