"""Issue 51 items 4, 5 and 9, on one real run: the builtin planner, on the simulated seed with one
trial left in its budget, tries two levers as one change; every output (the terminal's todo and
end lines, the report, the review, `transcripts list` and `show`, the HTML export, `run --json`)
shows it as one change with its one measured effect and what is known of each member, and the
user's own workload before and after (the final check) with intervals; the review counts every
rollback the terminal showed; nothing is cut at 80 columns."""

from __future__ import annotations

import asyncio
import io
import json
import re
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from agent.cli.main import app
from agent.session import RunOptions, run_session
from agent.transcripts.before_after import FINAL_CHECK, compare
from agent.transcripts.export import export_html
from agent.transcripts.load import load_transcript
from agent.transcripts.markdown import review_markdown
from agent.transcripts.report import end_lines, run_summary
from agent.transcripts.review import build_review
from agent.transcripts.transcript import Transcript
from agent.ui import RunUI, live_columns
from sim import host
from tests.test_run_e2e import _fast_host
from tools.bench.objective import read_goal

# the two levers that help the seed at c=64: the CUDA graphs (kernels, the run's own workload) and
# mixed chunks (scheduling: judged on the shared-prefix mix, so the run ends with a final check)
PLAYBOOK = """
[[lever]]
flag = "--cuda-graph-max-bs"
mechanism = ["kernels"]
value = "{bench.max_concurrency}"
what = "largest decode batch in a CUDA graph"
helps = "when the served concurrency exceeds the captured batch size"
needs = ["flag.cuda_graph_max_bs_decode < bench.max_concurrency"]
priority = "high"
replaced_by = { flag = "--cuda-graph-max-bs-decode", value = "{bench.max_concurrency}" }

[[lever]]
flag = "--enable-mixed-chunk"
mechanism = ["scheduling"]
what = "mixes prefill chunks into decode batches"
helps = "constant arrivals"
needs = ["server.chunked_prefill_size > 0"]
priority = "medium"
"""
MEMBERS = ["--cuda-graph-max-bs-decode 64", "--enable-mixed-chunk"]
# the run the module-scoped fixture makes is a whole simulated run: they take turns (tests/fixtures/quiet.py)
pytestmark = pytest.mark.turns("whole-run")
INTERVAL = re.compile(r"[+-]\d+\.\d% \[[+-]\d+\.\d\.\.[+-]\d+\.\d\]")


@pytest.fixture(scope="module")
def bundle_run(tmp_path_factory: pytest.TempPathFactory, sglang_0523) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("bundle")
    config = _fast_host(tmp, "seed", sglang_0523, time_scale=0.125)
    # two relaunches of known-good measure the restart spread: the second is a rollback
    config = config.model_copy(update={"bench": config.bench.model_copy(update={"spread_launches": 2})})
    (tmp / "playbook.toml").write_text(PLAYBOOK)
    transcript = Transcript.create(
        tmp / "transcripts",
        kind="run",
        goal="improve throughput",
        model="builtin",
        target="sim",
        config=config,
    )
    out = io.StringIO()
    ui = RunUI(Console(file=out, width=80, record=True, force_terminal=False), transcript)
    # one trial left in the budget: what the builtin planner cannot try one at a time goes together
    opts = RunOptions(
        goal=read_goal("improve throughput"), playbook=tmp / "playbook.toml", max_trials=1, max_restarts=40
    )
    try:
        result = asyncio.run(run_session(config, opts, ui))
        transcript.close({"kept": result.kept, "status": result.status})
    finally:
        host.down(tmp / "sim")
    return {"result": result, "path": transcript.path, "terminal": ui.console.export_text(), "dir": tmp}


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.slow(seconds=120)
@pytest.mark.timeout(900)
def test_the_terminal_shows_one_change_with_its_members_and_the_user_s_workload(bundle_run) -> None:  # type: ignore[no-untyped-def]
    result, terminal = bundle_run["result"], bundle_run["terminal"]
    (trial,) = result.trials
    assert trial.kind == "bundle" and [c.describe() for c in trial.changes] == MEMBERS, result.trials
    assert trial.decision == "kept", trial.why  # the seed's two levers: ~+10% at c=64 together
    assert max(map(len, terminal.splitlines())) <= 80
    # the todo list whole once at the start and once at the end; in between only what changed
    assert terminal.count("── todo ─") == 1 and terminal.count("── todo, final ─") == 1, terminal
    final = terminal.split("── todo, final ─", 1)[1].split("╰", 1)[0]
    flat = _flat(final.replace("│", " "))
    assert flat.count("2 flags tried together") == 1 and flat.count("[x] ") == 1, flat
    effect = trial.headline().split("]: ", 1)[1]
    assert flat.count(effect) == 1  # its one effect, once: not beside each member as if it had won alone
    for member in MEMBERS:
        assert f"{member} — research: applies (code, certainty" in flat
        assert f"[x] trial {member}" not in flat
    assert flat.count("its own effect not measured separately") == 2
    # the end of the run: one headline for the change, a line per member, the user's workload
    lines = end_lines(result)
    assert lines[0] == trial.headline() and lines[0].startswith(f"trial 1 [together: {' + '.join(MEMBERS)}]")
    assert sum("its own effect not measured separately" in line for line in lines[1:3]) == 2
    assert lines[-1].startswith("on your workload (random prompts") and len(INTERVAL.findall(lines[-1])) == 2


@pytest.mark.slow(seconds=120)
@pytest.mark.timeout(900)
def test_every_saved_output_shows_the_change_its_members_and_the_final_check(bundle_run) -> None:  # type: ignore[no-untyped-def]
    result, path = bundle_run["result"], bundle_run["path"]
    review = build_review(load_transcript(path))
    ba = review.before_after
    # the final check: the winner was judged on the shared-prefix mix, the user's workload is random
    assert result.trials[0].workload and ba is not None and ba.source == FINAL_CHECK
    assert [(lv.concurrency, lv.n_before, lv.n_after) for lv in ba.levels] == [(1, 3, 3), (64, 3, 3)]
    assert all(lv.ci_low is not None and lv.ci_low <= lv.ratio <= lv.ci_high for lv in ba.levels)
    assert ba.level_at(64).ratio > 1.02  # the two levers act at c=64 on random prompts too

    report = result.report.read_text()
    section = report.split("## Before and after on your workload", 1)[1].split("\n## ", 1)[0]
    for lv in ba.levels:
        assert f"| {lv.concurrency} | {lv.before:,.1f} | {lv.after:,.1f} | {lv.change()} | 3 / 3 |" in section
    assert "not paired" in section and "final check" in section
    together = report.split("## Tried together", 1)[1].split("\n## ", 1)[0]
    assert "one measured effect for all 2: kept: c=64" in together
    assert all(f"{m} — research: applies" in together for m in MEMBERS)

    md = review_markdown(review)
    trial = md.split("### Trial 1: ", 1)[1].split("\n### ", 1)[0]
    assert trial.startswith(f"together: {' + '.join(MEMBERS)} — **kept**")
    assert trial.count("its own effect not measured separately") == 2
    kept = md.split("## Kept", 1)[1].split("\n## ", 1)[0]
    assert f"- {' + '.join(MEMBERS)} (tried together in trial 1" in kept
    gain = md.split("## Final gain per concurrency level", 1)[1]
    assert "On your workload:" in gain and all(lv.change() in gain for lv in ba.levels)
    page = export_html(load_transcript(path))
    assert "2 flags tried together, one effect for all:" in page and ba.levels[-1].change() in page

    runner = CliRunner()
    listed = runner.invoke(app, ["transcripts", "list", "--dir", str(path.parent)], env={"COLUMNS": "80"})
    assert listed.exit_code == 0 and max(map(len, listed.stdout.splitlines())) <= 80
    assert "(together in trial 1, one effect)" in _flat(listed.stdout)
    for member in MEMBERS:  # each flag name whole on its line (at 80 columns it was cut in two)
        assert any(member.split()[0] in line for line in listed.stdout.splitlines()), listed.stdout
    listed_json = runner.invoke(app, ["transcripts", "list", "--dir", str(path.parent), "--json"])
    row = json.loads(listed_json.stdout)[0]
    assert row["together"][0]["changes"] == MEMBERS and row["user_workload"]["source"] == FINAL_CHECK

    summary = run_summary(result)  # `optagent run --json`
    members = summary["kept"][0]["together"]["members"]
    assert [m["change"] for m in members] == MEMBERS and not any(m["own_effect_measured"] for m in members)
    at64 = summary["user_workload"]["levels"]["64"]
    assert at64["repetitions_before"] == at64["repetitions_after"] == 3
    assert at64["ci_low_pct"] <= at64["change_pct"] <= at64["ci_high_pct"]
    data = json.loads(runner.invoke(app, ["transcripts", "review", str(path), "--json"]).stdout)
    assert data["together"][0]["members"][0]["own"] == "its own effect not measured separately"


@pytest.mark.slow(seconds=120)
@pytest.mark.timeout(900)
def test_the_review_counts_every_rollback_the_terminal_showed(bundle_run) -> None:  # type: ignore[no-untyped-def]
    review = build_review(load_transcript(bundle_run["path"]))
    shown = bundle_run["terminal"].count("deploy: rollback")
    assert shown >= 1  # the launch spread's second relaunch at least
    assert review.rollback_count == shown, (review.rollbacks, bundle_run["terminal"][-3000:])
    assert review.rollbacks[0].startswith("Launch spread: 1 rollback among 2 relaunches")
    md = review_markdown(review)
    assert "## Rollbacks\n\nnone" not in md and review.rollbacks[0] in md


@pytest.mark.slow(seconds=120)
@pytest.mark.timeout(900)
def test_show_reads_as_text_not_python_reprs(bundle_run) -> None:  # type: ignore[no-untyped-def]
    shown = CliRunner().invoke(app, ["transcripts", "show", str(bundle_run["path"])], env={"COLUMNS": "100"})
    assert shown.exit_code == 0, shown.output
    head = shown.stdout.split("[msg 1]", 1)[0]  # the events before the planner's first message
    assert "● deploy preflight: (target: local; service: sglang" in head
    assert "{'" not in shown.stdout and "': " not in head
    assert "● trial together: --cuda-graph-max-bs-decode 64 + --enable-mixed-chunk" in _flat(shown.stdout)
    final = _flat(shown.stdout.split("● final", 1)[1])  # the user's workload, before and after
    ba = build_review(load_transcript(bundle_run["path"])).before_after
    assert final.startswith("Your workload (random prompts") and "from the final check" in final
    assert all(lv.change() in final for lv in ba.levels) and len(INTERVAL.findall(final)) == 2, final


def test_a_live_line_at_80_columns_wraps_its_words_and_keeps_the_time_whole() -> None:
    from rich.progress import Progress

    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True, color_system=None)
    label = "trial 3 · block 4/5, without --enable-mixed-chunk, candidate, second launch"
    bar = Progress(*live_columns(console, label), console=console)
    bar.add_task("x", total=128, completed=100, info="c=64 100/128 req 1,514 tok/s rep 2/3")
    console.print(bar.make_tasks_table(bar.tasks))
    text = out.getvalue()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80, text
    words = text.split()
    assert "--enable-mixed-chunk," in words and "1,514" in words and "0:00:00" in words, text


def test_one_repetition_a_side_gives_no_interval_and_says_so(sim_server) -> None:  # type: ignore[no-untyped-def]
    from tools.bench.loadgen import run_repeated
    from tools.config import BenchConfig

    server = sim_server()
    bench = BenchConfig(concurrency=[1, 4], input_len=64, output_len=8, warmup=0, prompts_per_level=4)
    before = [s.model_dump(mode="json") for s in asyncio.run(run_repeated(server.endpoint, bench, reps=3))]
    after = [s.model_dump(mode="json") for s in asyncio.run(run_repeated(server.endpoint, bench, reps=3))]
    three = compare(before, after, workload="random", source=FINAL_CHECK, kept=True)
    assert all(lv.ci_low is not None and lv.n_before == lv.n_after == 3 for lv in three.levels)
    one = compare(before[:1], after[:1], workload="random", source=FINAL_CHECK, kept=True)
    assert all(lv.ratio is not None and lv.ci_low is None for lv in one.levels)
    assert "1 repetition(s) before and 1 after: too few for an interval, none shown" in one.note
    assert "[" not in one.summary().split(":", 1)[1]  # no interval invented
    nothing = compare(before, [], workload="random", source=FINAL_CHECK, kept=True)
    assert not nothing.measured and "the final check measured nothing" in nothing.summary()
