"""Progress on the long waits (issue 28 item 3): a code index build and a source fetch are shown
while they last (tools/ only call back), each research verdict is a line with its seconds as it
arrives, and a live line counts the verdicts still to come."""

from __future__ import annotations

import asyncio
import io
import json
import re
import time
from pathlib import Path

import pytest
from rich.console import Console

from agent.policy.todo import TodoItem, TodoList
from agent.policy.verdict import FlagVerdict
from agent.ui import RunUI
from tests.fixtures.sglang_src import synthetic_tree
from tests.test_research_index import FILES


def _ui(**kw: object) -> tuple[RunUI, io.StringIO]:
    out = io.StringIO()
    return RunUI(Console(file=out, width=120, **kw)), out  # type: ignore[arg-type]


def test_an_index_build_is_shown_while_it_lasts_and_only_then(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tools.research.index import load_index

    tree = synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.9")
    ui, out = _ui()
    said: list[str] = []
    with ui.waiting() as say:
        load_index(tree, progress=lambda text: (said.append(text), say(text)))
    assert said == ["building the code index of SGLang 9.9.9 (once per source tree)"]
    lines = out.getvalue().splitlines()
    assert lines[0] == "  building the code index of SGLang 9.9.9 (once per source tree)..."
    assert re.fullmatch(
        r"  building the code index of SGLang 9\.9\.9 \(once per source tree\): done in \d+ s", lines[-1]
    )
    assert ui._research_bar is None and ui._wait_bar is None

    ui, out = _ui()
    with ui.waiting() as say:
        load_index(tree, progress=say)  # in memory now: nothing to wait for, nothing shown
    monkeypatch.setattr("tools.research.index._LOADED", {})
    with ui.waiting() as say:
        load_index(tree, progress=say)  # from disk: no build either
    assert out.getvalue() == ""


def test_a_source_fetch_calls_back_before_it_starts_and_a_cached_tree_does_not(tmp_path: Path) -> None:
    """A version the package index does not have: the fetch is announced, then fails (both fetchers
    are tried); a cached tree is read without a word. No network is needed to fail here: pip is
    pointed at a closed loopback port."""
    from tools.research.source import get_source
    from tools.research.source_fetch import SourceError

    said: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
        mp.setenv("PIP_FIND_LINKS", "")
        mp.setenv("PIP_RETRIES", "0")
        with pytest.raises(SourceError):
            get_source("0.0.1", cache_dir=tmp_path, repo_url="http://127.0.0.1:9/none.git",
                       git_timeout=20, pip_timeout=60, progress=said.append)  # fmt: skip
    assert said == ["fetching the source of SGLang 0.0.1 (once per version)"]

    cached = tmp_path / "sglang-src" / "0.0.2"
    (cached / "sglang").mkdir(parents=True)
    from tools.research import source

    digest = source.tree_digest(cached, skip=source.SKIPPED)  # the record of what was unpacked
    marker = {"version": "0.0.2", "origin": "test", "layout": source._LAYOUT, "digest": digest}
    (cached / source._MARKER).write_text(json.dumps(marker))
    said.clear()
    assert get_source("0.0.2", cache_dir=tmp_path, progress=said.append).version == "0.0.2"
    assert said == []


def _verdict(flag: str, verdict: str, certainty: float) -> FlagVerdict:
    return FlagVerdict(
        flag=flag, verdict=verdict, summary=f"{flag} summary", decided_by="code", certainty=certainty
    )


def test_each_verdict_is_a_line_with_its_seconds_as_it_arrives() -> None:
    ui, out = _ui(force_terminal=True)
    todo = TodoList(items=[
        TodoItem(id="a", content="research --enable-mixed-chunk", status="in_progress"),
        TodoItem(id="b", content="research --cuda-graph-max-bs-decode 64", status="in_progress"),
        TodoItem(id="c", content="trial the kept flags together", status="pending"),
    ])  # fmt: skip
    ui.todo(todo, ["[~] research --enable-mixed-chunk"])
    assert set(ui._research) == {"--enable-mixed-chunk", "--cuda-graph-max-bs-decode"}
    assert ui._research_bar is not None  # "researching 2 flags ..." while nothing has come back
    time.sleep(1.1)
    ui.verdict(_verdict("--enable-mixed-chunk", "applies", 0.95))
    assert ui._research_bar is not None  # one verdict still to come
    ui.todo(todo, [])  # the list still shows both in progress: no clock restarts for a flag answered
    assert set(ui._research) == {"--cuda-graph-max-bs-decode"}
    ui.verdict(_verdict("--cuda-graph-max-bs-decode", "no-op", 0.55))
    assert ui._research_bar is None and not ui._research
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # the terminal's colours and cursor moves
    first = re.search(r"--enable-mixed-chunk: applies \(code, certainty 0\.95, (\d+) s\)", text)
    assert first and int(first.group(1)) >= 1, text
    assert re.search(r"--cuda-graph-max-bs-decode: no-op \(code, certainty 0\.55, \d+ s\)", text)
    assert "researching 2 flags in the SGLang source (0 done)" in text
    assert "researching 1 flag in the SGLang source (1 done)" in text


def test_a_verdict_whose_start_was_not_seen_has_no_seconds() -> None:
    ui, out = _ui()
    ui.verdict(_verdict("--enable-mixed-chunk", "applies", 0.9))
    assert (
        "--enable-mixed-chunk: applies (code, certainty 0.90) — --enable-mixed-chunk summary"
        in out.getvalue()
    )


def test_a_trial_block_line_gives_its_number_of_planned_and_its_numbers(sim_server) -> None:  # type: ignore[no-untyped-def]
    """The block's line when done names it with its number out of the blocks planned, and the mean
    tok/s per level of its repetitions (the live bar's final figures of each level)."""
    from tools.bench.loadgen import run_sweep
    from tools.config import BenchConfig

    server = sim_server()
    ui, out = _ui()
    settings = BenchConfig(
        concurrency=[1, 4], input_len=64, output_len=32, prompts_per_level=8, warmup=1, reps=1
    )
    ui.record("block", {"trial": 3, "block": "before", "label": "known-good before", "state": "start"})
    sweeps = [
        asyncio.run(run_sweep(server.endpoint, settings, on_progress=ui.bench_progress)) for _ in range(2)
    ]
    ui.record("block", {"trial": 3, "block": "before", "state": "done", "reps": 2, "seconds": 4.2})
    means = {c: sum(s.level(c).output_throughput for s in sweeps) / 2 for c in (1, 4)}
    expected = f"trial 3 · block 1/3, known-good before done: 2 repetitions in 4 s; c=1 {means[1]:,.0f}, c=4 {means[4]:,.0f} tok/s"
    assert expected in out.getvalue().replace("\n", " "), out.getvalue()


def test_a_block_outside_any_trial_is_named_without_a_trial_number() -> None:
    """The baseline phase relaunches known-good to measure the launch spread (agent/trial/spread.py):
    its blocks have no trial (the line said 'trial None · block 1/3')."""
    ui, out = _ui()
    for i in (1, 2):
        ui.record(
            "block",
            {"trial": None, "block": f"spread launch {i}", "label": f"spread launch {i}", "state": "start"},
        )
        ui.record("block", {"trial": None, "state": "done", "reps": 3, "seconds": 80})
    assert out.getvalue().splitlines() == [
        "  known-good, spread launch 1 done: 3 repetitions in 80 s",
        "  known-good, spread launch 2 done: 3 repetitions in 80 s",
    ]


def test_research_a_step_left_without_a_verdict_is_forgotten() -> None:
    """A chat step cancelled mid-research (Ctrl-C): its flags do not come back in the live count."""
    ui, _ = _ui(force_terminal=True)
    ui.research_started("--enable-mixed-chunk")
    ui.end_research()
    assert ui._research_bar is None and not ui._research
    ui.research_started("--disable-radix-cache")
    assert list(ui._research) == ["--disable-radix-cache"]
    ui.verdict(_verdict("--disable-radix-cache", "applies", 0.9))
    assert ui._research_bar is None
