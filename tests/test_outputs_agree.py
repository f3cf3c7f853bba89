"""One saved run, every output: the report, its conclusion, the review (Markdown, 80-column terminal,
JSON), the list, the HTML export, the plot, the terminal headline and `run --json` show the numbers
the kept change's decision used (its paired blocks, with the 95% interval), and no other number
about that change."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from agent.cli.main import app
from agent.policy.builtin.conclusion import conclusion
from agent.policy.planner import trial_result
from agent.session import RunResult
from agent.transcripts.export import export_html, plot_figure
from agent.transcripts.load import load_transcript
from agent.transcripts.markdown import review_markdown
from agent.transcripts.report import run_summary, write_report
from agent.transcripts.review import build_review, gain_summary
from tests.transcript_sessions import write_paired_run
from tools.bench.effect import effect_of

pytestmark = pytest.mark.server

PCT = re.compile(r"[+-]\d+\.\d%")


def _section(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


def test_every_output_of_one_saved_run_shows_the_decisions_numbers(tmp_path: Path) -> None:
    path, trials = write_paired_run(tmp_path)
    won = trials[1]
    effect = effect_of(won.model_dump(mode="json"))
    assert effect is not None and effect.deciding is not None and effect.deciding.concurrency == 64
    headline = "kept: c=64 " + effect.deciding.pct() + ", no level worse than 3%"
    allowed = {p for lv in effect.levels for p in PCT.findall(lv.pct())}
    cells = {
        lv.concurrency: (f"{lv.known_good:,.1f}", f"{lv.candidate:,.1f}", lv.pct()) for lv in effect.levels
    }
    # the decision's numbers are its own blocks: candidate / known-good is the decision's ratio
    for lv in effect.levels:
        assert abs(lv.candidate / lv.known_good - lv.ratio) < 1e-9

    # the terminal headline names the deciding level and its interval
    assert won.headline().endswith(headline)

    # the conclusion, written from the planner's tool results
    deps = SimpleNamespace(baseline_levels={1: 127.5, 8: 700.0, 64: 2300.0}, runner=None)
    results = {t.changes[0].flag: trial_result(deps, t) for t in trials}
    text = conclusion([], {}, results, None, None)
    deployed = text.split("Deployed: ", 1)[1].split("\n", 1)[0]
    assert headline in deployed and set(PCT.findall(deployed)) <= allowed, deployed
    assert f"c=64: {effect.level(64).known_good:,.0f} -> {effect.level(64).candidate:,.0f} tok/s" in deployed

    # the report and its plot, written from the run's result
    result = RunResult(
        status="completed", transcript=path, trials=trials, kept=["--cuda-graph-max-bs-decode 64"],
        baseline={1: 127.5, 8: 700.0, 64: 2300.0}, final={1: 120.2, 8: 685.0, 64: 2323.0},
        restarts=3, seconds=600.0, conclusion=text,
    )  # fmt: skip
    report = write_report(result, baseline_reps=[], best_reps=None).read_text()
    kept_part = _section(report, "## What the kept change did", "## Before and after on your workload")
    assert headline in kept_part and set(PCT.findall(kept_part)) <= allowed, kept_part
    for c, (kg, cand, change) in cells.items():
        assert f"| {c} | {kg} | {cand} | {change} |" in kept_part
    # the first baseline (other load) vs final is no number about the change: it has a section of
    # its own, the user's workload before and after, that says what it compares
    assert "-5.7%" not in kept_part
    workload = _section(report, "## Before and after on your workload", "## How a change was judged")
    assert "| 1 | 127.5 | 120.2 | -5.7% [" in workload and "not paired" in workload, workload
    assert "519.33" not in report and "trial 2 `--cuda-graph-max-bs-decode 64`: **kept**, c=64" in report

    # the review, as Markdown and at 80 columns in a terminal
    review = build_review(load_transcript(path))
    md = review_markdown(review)
    final = md.split("## Final gain per concurrency level", 1)[1].split("On your workload:", 1)[0]
    assert headline in final and set(PCT.findall(final)) <= allowed, final
    for c, (kg, cand, change) in cells.items():
        assert f"| {c} | {kg} | {cand} | {change} |" in final
    assert "Seconds: 519\n" in md and "519.33" not in md and "Throughput ratio" not in md
    runner = CliRunner()
    shown = runner.invoke(app, ["transcripts", "review", str(path)], env={"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    assert max(map(len, shown.stdout.splitlines())) <= 80
    flat = " ".join(shown.stdout.split())
    assert headline in flat and "…" not in shown.stdout

    # the list and the review JSON
    listed = runner.invoke(app, ["transcripts", "list", "--dir", str(tmp_path), "--json"])
    row = json.loads(listed.stdout)[0]
    assert row["throughput_change"] == f"c=64 {effect.deciding.pct()}"
    data = json.loads(runner.invoke(app, ["transcripts", "review", str(path), "--json"]).stdout)
    assert data["kept_trials"][0]["headline"] == headline

    # the HTML export
    page = export_html(load_transcript(path))
    assert headline in page and all(change in page for _, _, change in cells.values())

    # the plot: the kept trial's bars are the decision's changes, with its intervals as error bars
    fig = plot_figure(review)
    bars = fig.axes[1]
    kept_bars = sorted((p for p in bars.patches if p.get_linewidth() == 2), key=lambda p: p.get_x())
    assert [round(p.get_height(), 6) for p in kept_bars] == [
        round((lv.ratio - 1) * 100, 6) for lv in effect.levels
    ]
    segments = [seg for coll in bars.collections for seg in coll.get_segments()]
    for lv in effect.levels:
        low, high = (lv.ci_low - 1) * 100, (lv.ci_high - 1) * 100
        assert any(abs(s[0][1] - low) < 1e-6 and abs(s[1][1] - high) < 1e-6 for s in segments), lv

    # optagent run --json
    summary = run_summary(result)
    level = summary["kept"][0]["levels"]["64"]
    assert summary["kept"][0]["headline"] == headline and summary["deployed"] == [
        "--cuda-graph-max-bs-decode 64"
    ]
    assert f"{level['change_pct']:+.1f}%" == PCT.findall(effect.deciding.pct())[0]
    assert (level["ci_low_pct"], level["ci_high_pct"]) == (
        round((effect.deciding.ci_low - 1) * 100, 2),
        round((effect.deciding.ci_high - 1) * 100, 2),
    )


def test_two_kept_changes_each_show_their_own_effect_and_one_cumulative_table(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from agent.ui import RunUI
    from tests.transcript_sessions import sweep
    from tools.bench.results import SweepResult

    transcript, trials = write_paired_run(tmp_path, open_end=True)
    best = [SweepResult.model_validate(sweep({1: 120.1, 8: 686.0, 64: 2522.0}))] * 3
    result = RunResult(
        status="completed", transcript=transcript.path, trials=trials,
        kept=["--cuda-graph-max-bs-decode 64", "--enable-mixed-chunk 64"],
        baseline={1: 127.5, 8: 700.0, 64: 2300.0}, final={1: 120.1, 8: 686.0, 64: 2522.0}, restarts=5,
    )  # fmt: skip
    ui = RunUI(Console(file=io.StringIO()), transcript)
    report = write_report(result, baseline_reps=[], best_reps=best, ui=ui).read_text()
    transcript.close({"kept": result.kept, "status": "completed"})
    md = review_markdown(build_review(load_transcript(transcript.path)))
    for t in trials[1:]:  # each kept change: its own decision, in both
        effect = effect_of(t.model_dump(mode="json"))
        assert t.headline().split("]: ", 1)[1] in report and t.headline().split("]: ", 1)[1] in md
        assert effect.level(64).pct() in report and effect.level(64).pct() in md
    # the cumulative before/after, the user's workload measured at the end against the baseline,
    # labelled, with the same numbers and intervals in the report and the review
    rows = [
        "| 1 | 127.5 | 120.1 | -5.8% [",
        "| 8 | 700.0 | 686.0 | -2.0% [",
        "| 64 | 2,300.0 | 2,522.0 | +9.7% [",
    ]
    cumulative = md.split("On your workload:", 1)[1]
    assert "## Before and after on your workload" in report and "not paired" in cumulative
    assert all(r in cumulative and r in report for r in rows), cumulative
    table = [line for line in cumulative.splitlines() if line.startswith("| 64 |")]
    assert table[0] in report  # the same interval in both


def test_the_run_s_before_and_after_are_measured_on_the_same_workload(tmp_path: Path) -> None:
    # the last winner was judged on the shared-prefix mix (a scheduling flag), the baseline on random
    # prompts: the before/after must not set one against the other (the seed read +26% at c=64 for two
    # kept changes of +3% each), so the final configuration is measured again on the baseline's prompts
    import asyncio
    import io
    import time

    from rich.console import Console

    from agent.session import _final
    from agent.transcripts.transcript import Transcript
    from agent.trial.record import Baseline
    from agent.ui import RunUI
    from sim import host
    from tests.fixtures.sim import free_port
    from tools.bench.loadgen import run_repeated
    from tools.bench.workload import TRIAL_MIX

    config = host.ensure_up(tmp_path / "sim", scenario="seed", port=free_port(), time_scale=0.05)
    try:
        bench = config.bench.model_copy(
            update={"concurrency": [1, 8], "input_len": 256, "output_len": 32, "warmup": 0, "reps": 2}
        )
        config = config.model_copy(update={"bench": bench})
        endpoint = config.target.endpoint
        before = asyncio.run(run_repeated(endpoint, bench))
        mix = asyncio.run(run_repeated(endpoint, bench.model_copy(update={"workload": dict(TRIAL_MIX)})))
        transcript = Transcript.create(tmp_path / "t", kind="run", goal="g", model="builtin", target="sim")
        ui = RunUI(Console(file=io.StringIO()), transcript)
        best = SimpleNamespace(workload="50% random prompts, 50% shared-prefix prompts")  # its record
        runner = SimpleNamespace(
            best=best, best_reps=mix, kept_changes=[], trials=[], restarts=0, exhausted=None, halted=None
        )
        baseline = Baseline(reps=before, probe=None, text="")
        result = asyncio.run(_final(ui, config, runner, baseline, "done", "completed", time.monotonic(), 0.0))
        transcript.close({"status": "test"})
    finally:
        host.down(tmp_path / "sim")
    loaded = load_transcript(transcript.path)
    assert loaded.events_of("final"), [
        e["data"] for e in loaded.events_of("note")
    ]  # why it failed, if it did
    final = loaded.events_of("final")[0]["data"]["reps"]
    assert [r["settings"]["workload"] for r in final] == [before[0].settings["workload"]] * 2
    # the same prompts, level by level and repetition by repetition (not the mix's: those share a prefix)
    sent = [[lv["total_input_tokens"] for lv in rep["levels"]] for rep in final]
    assert sent == [[lv.total_input_tokens for lv in rep.levels] for rep in before]
    assert sent != [[lv.total_input_tokens for lv in rep.levels] for rep in mix]
    # the before/after is that block's: both levels measured (their speeds are the simulator's under
    # the suite's load, which moved them apart by more than 10% one run in three with 4 workers)
    assert set(result.final) == set(result.baseline) == {1, 8} and min(result.final.values()) > 0, result


def test_a_latency_decision_shows_its_own_metric_and_says_its_changes_are_gains() -> None:
    from agent.transcripts.markdown import trial_table
    from agent.transcripts.review import trial_record
    from agent.trial.record import TrialChange, TrialRecord, block_samples, comparison_dict
    from tools.bench.objective import objective_from_goal
    from tools.bench.paired import paired_compare
    from tools.bench.results import LevelResult, SweepResult

    def block(ttft: dict[int, float], spread: list[float]) -> list[SweepResult]:
        return [
            SweepResult(
                endpoint="http://127.0.0.1:1",
                api="completions",
                seed=i,
                levels=[
                    LevelResult(
                        max_concurrency=c,
                        num_prompts=8,
                        completed=8,
                        output_throughput=100.0,
                        p99_ttft_ms=v * s,
                    )
                    for c, v in ttft.items()
                ],
            )  # fmt: skip
            for i, s in enumerate(spread)
        ]

    goal = objective_from_goal("p99 ttft at concurrency 8")
    known_good = {1: 80.0, 8: 600.0}
    before, after = block(known_good, [0.99, 1.0, 1.01]), block(known_good, [1.0, 1.005, 0.995])
    cand = block({1: 84.0, 8: 660.0}, [0.99, 1.01, 1.0])  # 5% and 10% slower to the first token
    cmp = paired_compare(before, cand, after, goal)
    assert "p99_ttft_ms at concurrency 8 as a gain (+ = lower) -9." in cmp.summary  # 600/660 - 1
    record = TrialRecord(
        number=1, changes=[TrialChange(flag="--enable-mixed-chunk")], decision="rolled_back",
        why=cmp.summary, comparison=comparison_dict(cmp), deployed=True,
        samples={n: block_samples(b, ["p99_ttft_ms"]) for n, b in
                 (("before", before), ("candidate", cand), ("after", after))},
    )  # fmt: skip
    assert record.headline().endswith("]: rolled back: c=8 gain -9.1% [-11.5..-6.6] (regressed)")
    table = "\n".join(trial_table(trial_record(1, {"data": record.model_dump(mode="json")}, {})))
    # the decision's own numbers in its own unit, never tok/s beside a change in TTFT
    assert "known-good p99 TTFT ms | candidate p99 TTFT ms | gain [95% CI], + = lower" in table
    assert "| 8 | 600.0 | 660.0 | -9." in table and "tok/s" not in table


def test_a_kept_latency_change_is_not_plotted_as_paired_tok_s(tmp_path: Path) -> None:
    from agent.transcripts.transcript import Transcript
    from agent.trial.record import TrialChange, TrialRecord, block_samples, comparison_dict
    from tests.transcript_sessions import sweep
    from tools.bench.objective import objective_from_goal
    from tools.bench.paired import paired_compare
    from tools.bench.results import LevelResult, SweepResult

    def block(ttft: float, spread: list[float]) -> list[SweepResult]:
        return [SweepResult(endpoint="http://127.0.0.1:1", api="completions", seed=i, levels=[
                    LevelResult(max_concurrency=8, num_prompts=8, completed=8, output_throughput=700.0,
                                p99_ttft_ms=ttft * s)]) for i, s in enumerate(spread)]  # fmt: skip

    before, after, cand = (
        block(600.0, [0.99, 1.0, 1.01]),
        block(600.0, [1.0, 1.005, 0.995]),
        block(500.0, [1, 1, 1]),
    )
    cmp = paired_compare(before, cand, after, objective_from_goal("p99 ttft at concurrency 8"))
    assert cmp.verdict == "improved", cmp.summary
    record = TrialRecord(
        number=1, changes=[TrialChange(flag="--enable-mixed-chunk")], decision="kept", improved=True,
        why=cmp.summary, comparison=comparison_dict(cmp), deployed=True, levels={8: 700.0},
        samples={n: block_samples(b, ["p99_ttft_ms"]) for n, b in
                 (("before", before), ("candidate", cand), ("after", after))},
    )  # fmt: skip
    t = Transcript.create(
        tmp_path, kind="run", goal="p99 ttft at concurrency 8", model="builtin", target="sim"
    )
    t.event("baseline", {"reps": [sweep({8: 690.0})] * 3})
    t.event("trial", record.model_dump(mode="json"))
    t.close({"kept": ["--enable-mixed-chunk"], "status": "completed"})
    review = build_review(load_transcript(t.path))
    assert gain_summary(review).startswith("c=8 gain +20.")  # `transcripts list`
    fig = plot_figure(review)
    left = fig.axes[0]
    assert left.get_title() == "Kept change"  # its tok/s are no paired blocks of its decision
    assert "baseline (start of run)" in [x.get_text() for x in left.get_legend().get_texts()]
    # `run --json`: that metric's numbers under its own name, the ratio as a gain (+ is lower)
    result = RunResult(
        status="completed", transcript=t.path, trials=[record], kept=["--enable-mixed-chunk"],
        baseline={8: 690.0}, final={8: 700.0}, restarts=2, seconds=60.0, conclusion="",
    )  # fmt: skip
    kept = run_summary(result)["kept"][0]
    level = kept["levels"]["8"]
    assert kept["metric"] == "p99_ttft_ms" and "known_good_tok_s" not in level and "change_pct" not in level
    assert abs(level["known_good_p99_ttft_ms"] - 600.0) < 1 and abs(level["candidate_p99_ttft_ms"] - 500) < 1
    assert abs(level["gain_pct"] - 20.0) < 0.5  # 600 -> 500 ms: 20% as a gain
