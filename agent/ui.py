"""What a run shows and records: every step printed with rich and written to the transcript."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Column

from agent.live import LiveProgress
from agent.policy.todo import TodoList
from agent.policy.verdict import FlagVerdict
from agent.transcripts.bundles import group_todo, together
from agent.transcripts.verdicts import plain_condition

_VERDICT_STYLE = {
    "applies": "green",
    "no-op": "yellow",
    "dead": "red",
    "incompatible": "red",
    "incompatible-with-version": "red",
    "refuses-to-start": "red",
    "unknown": "magenta",
}


def bench_info(p: Any) -> str:
    """One progress line of a benchmark level; at a level's end its tok/s is the table's number."""
    return f"c={p.concurrency} {p.done}/{p.total} req {p.tokens_per_s:,.0f} tok/s rep {p.rep + 1}/{p.reps}"


BLOCKS_PLANNED = {1: 3, 4: 5, 6: 8}
"""Blocks a trial plans when its block N starts: A/B/A (3); a second launch adds known-good once
more and the candidate (5); a third launch adds two known-good blocks and the candidate (8)."""
_RESEARCH_ITEM = re.compile(r"^research\b.*?(--[A-Za-z0-9][\w-]*)")


def live_columns(console: Console, label: str, *, bar: bool = True, info: bool = True) -> list[Any]:
    """The columns of a live line that fits the terminal cutting nothing: the elapsed time whole,
    the label and the figures wrapped at their spaces onto a second line when the width runs out
    (rich's default cut them with an ellipsis at 80 columns: `second lau…`, `0:01:…`), and a bar
    as wide as what is left allows (10 cells at 80 columns, 40 from 120)."""
    out: list[Any] = [TextColumn(label, table_column=Column(overflow="fold"))]
    if bar:
        out.append(BarColumn(bar_width=max(10, min(40, console.width - 80))))
    if info:
        out.append(TextColumn("{task.fields[info]}", table_column=Column(overflow="fold")))
    return [*out, TimeElapsedColumn(table_column=Column(no_wrap=True, min_width=7))]


def _dump(x: Any) -> Any:
    """A pydantic record (a trial, a verdict) as saved in the transcript; anything else as is."""
    return x.model_dump(mode="json") if hasattr(x, "model_dump") else x


def _spinner(console: Console, text: str) -> LiveProgress:
    """A live line: a spinner, `text` (markup escaped), the time elapsed; gone when stopped."""
    columns = live_columns(console, "{task.description}", bar=False, info=False)
    bar = LiveProgress(SpinnerColumn(), *columns, console=console, transient=True)
    bar.add_task(escape(text), total=None)
    return bar


@dataclass
class RunUI:
    """The console and the transcript of one session; `transcript` may be None (nothing saved)."""

    console: Console
    transcript: Any = None
    _wait_bar: Any = None
    _wait_task: Any = None
    _bench_bar: Any = None
    _bench_task: Any = None
    _block_label: str = "trial benchmark"
    _blocks: dict[Any, int] = field(default_factory=dict)
    _block_levels: dict[int, list[float]] = field(default_factory=dict)
    _research: dict[str, float] = field(default_factory=dict)
    """Flag -> when its research started (`research_started`), until its verdict arrives."""
    _researched: set[str] = field(default_factory=set)
    _research_done: int = 0
    _research_bar: Any = None
    _todo_blocks: list[str] = field(default_factory=list)
    """The todo list as last written (`TodoList.blocks`): a new list shows only what changed."""
    _todo_full: list[str] = field(default_factory=list)
    """The todo list as last shown whole."""

    def record(self, kind: str, data: Any, *, msg: int | None = None) -> None:
        """Write an event to the transcript (never raises); a trial's `block` start or end is shown,
        not recorded (the trial event holds every block's numbers)."""
        if kind == "block":
            return self.block(data)
        if self.transcript is not None:
            self.transcript.event(kind, data, msg=msg)

    def block(self, data: dict[str, Any]) -> None:
        """A trial's measurement block: its name and number on the live bar while it runs, a line
        when it is done, with the mean tok/s per level of its repetitions (`trial 2 · block 1/3,
        known-good before done: 3 repetitions in 87 s; c=1 121, c=8 866, c=64 2,310 tok/s ...`)."""
        trial = data.get("trial")
        if data.get("state") == "start":
            self._stop_bench()
            self._block_levels = {}
            if trial is None:  # a block outside any trial (the baseline phase's launch spread)
                self._block_label = f"known-good, {data.get('label')}"
                return
            n = self._blocks[trial] = self._blocks.get(trial, 0) + 1
            planned = max(v for k, v in BLOCKS_PLANNED.items() if k <= n)
            self._block_label = f"trial {trial} · block {n}/{max(planned, n)}, {data.get('label')}"
            return
        self._stop_bench()
        seconds = float(data.get("seconds") or 0)
        means = [f"c={c} {sum(v) / len(v):,.0f}" for c, v in sorted(self._block_levels.items()) if v]
        numbers = f"; {', '.join(means)} tok/s (mean of its repetitions)" if means else ""
        self.console.print(
            f"  [dim]{escape(self._block_label)} done: {data.get('reps')} repetitions in {seconds:.0f} s"
            f"{numbers}[/]",
            highlight=False,
        )
        self._block_label = "trial benchmark"

    def step(self, text: str) -> None:
        """A headline for a phase of the run."""
        self.console.rule(f"[bold]{text}")

    def note(self, text: str, *, record: bool = True) -> None:
        """A line of information, also recorded as a `note` event."""
        self.stop_wait()
        self.console.print(text, highlight=False)
        if record:
            self.record("note", {"text": text})

    def todo(
        self, todo: TodoList, changes: list[str], *, msg: int | None = None, trials: Sequence[Any] = (),
        verdicts: Mapping[str, Any] | None = None,
    ) -> None:  # fmt: skip
        """Show the list, the first time whole, then only the entries each change made (nothing
        when it is written again unchanged; `todo_final` shows the last list whole), and record its
        full state. A trial of several flags as one change (among `trials`, with the research
        `verdicts` of its members) is one entry with a line per member (`TodoList.blocks`). A
        research item put in progress starts that flag's research clock (`research_started`)."""
        groups = together([_dump(t) for t in trials], {f: _dump(v) for f, v in (verdicts or {}).items()})
        blocks = todo.blocks(group_todo([i.model_dump() for i in todo.items], groups))  # escaped
        changed = [b for b in blocks if b not in self._todo_blocks]
        if not self._todo_blocks:
            self.console.print(Panel("\n".join(blocks) or "(empty)", title="todo", expand=False))
            self._todo_full = blocks
        elif changed:  # a list of ~45 lines again for each step buried the steps: what changed
            title = f"todo: {len(changed)} of {len(blocks)} changed"
            self.console.print(Panel("\n".join(changed), title=title, expand=False))
        self._todo_blocks = blocks
        data: dict[str, Any] = {"items": [i.model_dump() for i in todo.items], "changes": changes}
        if groups:  # the review groups the members the same way
            data["together"] = [t.as_dict() for t in groups]
        self.record("todo", data, msg=msg)
        for item in todo.items:
            m = _RESEARCH_ITEM.match(item.content)
            if m and item.status == "in_progress" and m.group(1) not in self._researched:
                self.research_started(m.group(1))

    def todo_final(self) -> None:
        """The planning ended: its last todo list, whole, once (unless it was last shown whole)."""
        if self._todo_blocks and self._todo_blocks != self._todo_full:
            self.stop_wait()
            self.console.print(Panel("\n".join(self._todo_blocks), title="todo, final", expand=False))
            self._todo_full = self._todo_blocks

    def research_started(self, flag: str) -> None:
        """A flag's research began: its verdict line gives the seconds since, and a live line counts
        the verdicts still to come (research of several flags runs concurrently)."""
        self._researched.discard(flag)
        self._research.setdefault(flag, time.monotonic())
        self._show_research()

    def _show_research(self) -> None:
        """The live line while verdicts are still to come (none while another live display runs)."""
        if not self._research or self._wait_bar is not None or self._bench_bar is not None:
            return self._stop_research()
        n = len(self._research)
        label = f"researching {n} flag{'s' * (n != 1)} in the SGLang source ({self._research_done} done)"
        if self._research_bar is None:
            self._research_bar = _spinner(self.console, label)
            self._research_bar.start()
        else:
            self._research_bar.update(self._research_bar.task_ids[0], description=escape(label))

    def end_research(self) -> None:
        """Forget research still waiting for a verdict (a step ended or was cancelled)."""
        self._research.clear()
        self._research_done = 0
        self._stop_research()

    def _stop_research(self) -> None:
        if self._research_bar is not None:
            self._research_bar.stop()
            self._research_bar = None

    def verdict(self, v: FlagVerdict, *, msg: int | None = None) -> None:
        """Show a research verdict as it arrives (with the seconds its research took, when its
        start was seen) and its first pieces of evidence."""
        style = _VERDICT_STYLE.get(v.verdict, "")
        started = self._research.pop(v.flag, None)
        self._researched.add(v.flag)
        self._research_done = self._research_done + 1 if self._research else 0
        took = f", {time.monotonic() - started:.0f} s" if started is not None else ""
        self.console.print(
            f"[bold]{v.flag}[/]: [{style}]{v.verdict}[/] [dim]({v.decided_by}, certainty {v.certainty:.2f}"
            f"{took})[/] — {escape(v.summary)}",
            highlight=False,
        )
        for e in v.evidence[:3]:
            self.console.print(f"    {e.location}: [dim]{escape(e.quote)}[/]", highlight=False)
        for c in v.conditions[:4]:
            check = plain_condition(c.condition, c.fact, c.outcome)
            self.console.print(escape(f"    check {check}"), highlight=False)
        self.record("verdict", v.model_dump(mode="json"), msg=msg)
        self._show_research()

    def not_researched(self, flag: str, why: str) -> None:
        """A flag whose research never started (the run's deadline came first): said in place of
        its verdict, and no longer counted as a verdict to come. The transcript has it from the
        planner (`not_researched`)."""
        self._research.pop(flag, None)
        self._researched.add(flag)  # a todo list written again does not start its clock
        self.console.print(f"[bold]{flag}[/]: [yellow]{escape(why)}[/]", highlight=False)
        self._show_research()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[Callable[[str], None]]:
        """For a call that may wait long: yields `say(text)` (the `progress` callback of
        `get_source` and `load_index`); once said, a line and a spinner show it until the call
        returns, then a line with the seconds it took. Nothing shows when nothing was said."""
        said: list[tuple[str, float, LiveProgress]] = []
        lock = threading.Lock()
        closed = False

        def say(text: str) -> None:  # may be called from a worker thread, even after a Ctrl-C
            with lock:
                if closed:
                    return
                self.stop_wait()
                self.console.print(f"  [dim]{escape(text)}...[/]", highlight=False)
                bar = _spinner(self.console, text)
                bar.start()
                said.append((text, time.monotonic(), bar))

        ended = "stopped after"  # an exception or a Ctrl-C left the with-block
        try:
            yield say
            ended = "done in"
        finally:
            with lock:
                closed = True
                for text, started, bar in said:
                    bar.stop()
                    seconds = time.monotonic() - started
                    self.console.print(f"  [dim]{escape(text)}: {ended} {seconds:.0f} s[/]", highlight=False)

    def deploy_progress(self, phase: str, elapsed: float = 0.0, total: float | None = None) -> None:
        """`Deployment(on_progress=...)`: a bar while waiting for the restarted server, a line per step."""
        if phase.startswith("wait"):
            if self._wait_bar is None:
                self._stop_bench()
                self._stop_research()
                self._wait_bar = LiveProgress(
                    *live_columns(self.console, "waiting for the server ({task.fields[phase]})", info=False),
                    console=self.console,
                    transient=True,
                )
                self._wait_task = self._wait_bar.add_task("wait", total=total, phase=phase)
                self._wait_bar.start()
            self._wait_bar.update(
                self._wait_task, completed=elapsed, total=total, phase=phase.partition(":")[2]
            )
            return
        self.stop_wait()
        if phase == "rate-limit":
            self.console.print(
                f"  [dim]deploy: waiting {total or 0:.0f} s (restart rate limit)[/]", highlight=False
            )
        if phase in ("restart", "rollback", "upload"):
            self.console.print(f"  [dim]deploy: {phase}[/]", highlight=False)

    def stop_wait(self) -> None:
        """End the restart-wait bar and a trial's benchmark bar (only one live display may run at a time)."""
        if self._wait_bar is not None:
            self._wait_bar.stop()
            self._wait_bar = None
        self._stop_bench()
        self._stop_research()

    def _stop_bench(self) -> None:
        if self._bench_bar is not None:
            self._bench_bar.stop()
            self._bench_bar = None

    def bench_progress(self, p: Any) -> None:
        """`TrialRunner(on_progress=...)`: a live bar while a trial benchmarks (level, requests, tok/s),
        so the screen never keeps saying "waiting for the server" after the server is up."""
        if self._wait_bar is not None:
            self._wait_bar.stop()
            self._wait_bar = None
        self._stop_research()
        if p.finished:
            self._block_levels.setdefault(p.concurrency, []).append(p.tokens_per_s)
        if self._bench_bar is None:
            self._bench_bar = LiveProgress(
                *live_columns(self.console, escape(self._block_label)),
                console=self.console,
                transient=True,
            )
            self._bench_task = self._bench_bar.add_task("bench", total=None, info="")
            self._bench_bar.start()
        self._bench_bar.update(self._bench_task, total=p.total, completed=p.done, info=bench_info(p))

    @contextlib.contextmanager
    def progress(self, label: str) -> Iterator[Any]:
        """A progress bar for a benchmark; yields a callback for `run_repeated(on_progress=...)`."""
        self.stop_wait()
        bar = LiveProgress(
            *live_columns(self.console, "{task.description}"),
            console=self.console,
            transient=True,
        )
        task = bar.add_task(label, total=None, info="")

        def update(p: Any) -> None:
            bar.update(task, total=p.total, completed=p.done, info=bench_info(p))

        with bar:
            yield update
