"""The run report's wording: the decision rule, the budget, untried candidates, each trial once."""

from __future__ import annotations

from agent.session import RunResult
from agent.transcripts.report import RULE, render_report, time_use
from agent.trial.record import TrialChange, TrialRecord


def test_report_explains_the_rule_budget_and_untried_candidates_and_lists_trials_once():
    kept = TrialRecord(
        number=1, changes=[TrialChange(flag="--enable-mixed-chunk")], decision="kept", improved=True,
        why="improved: better by >= 2% at c=64", comparison={"ratio": 1.0123}, restarts=3, seconds=61.4,
        blocks={"before": 3, "candidate": 6, "after": 6, "confirm": 3},
    )  # fmt: skip
    env = TrialRecord(
        number=2, changes=[TrialChange(flag="--disable-radix-cache")], on_top_of=kept.changes,
        decision="rolled_back", why="environment failure, not the flag: the server's port is already in use",
        environment="the server's port is already in use", restarts=2, seconds=12.0,
    )  # fmt: skip
    result = RunResult(
        status="stopped: environment failure",
        trials=[kept, env],
        kept=["--enable-mixed-chunk"],
        baseline={1: 120.0, 64: 1150.0},
        final={1: 120.4, 64: 1199.9},
        restarts=5,
        seconds=245.6,
        conclusion="## Conclusion\n\nDeployed: x.\n\n### Trials\n- trial 1 again\n\n### Not tried\n- dup",
        budget="10 min wall-time budget (--max-minutes; the simulated deployment's default is 10), 4.1 min used; not spent",
        untried={"--speculative-num-steps 2": "trials stopped: environment failure"},
        rule=RULE.format(reps=3, cap=6, min_effect=0.02, tolerance=0.03),
    )
    text = render_report(result, plot_name=None)
    assert "Pareto rule" in text and "worse at none by more than 3%" in text
    assert "- budget: 10 min wall-time budget" in text and "not spent" in text
    assert "## Candidates not tried" in text and "--speculative-num-steps 2: trials stopped" in text
    assert text.count("trial 1 ") == 1 and "trial 1 again" not in text and "- dup" not in text
    assert "(on top of --enable-mixed-chunk)" in text
    assert "environment failure, not the flag" in text
    # one kept change: its own decision is the number; no first-baseline-vs-final table beside it
    assert "## What the kept change did" in text and "| 64 | 1,150.0 | 1,199.9 | +4.3% |" not in text
    assert "repetitions: before 3, candidate 6, after 6, confirm 3" in text


def test_a_flag_the_code_sent_to_a_trial_is_not_listed_as_ruled_out():
    from agent.policy.builtin.conclusion import conclusion
    from agent.policy.builtin.policy import _todo

    # the playbook says no-op (needs TP > 1); the code found a running reader; the trial rolled it back
    cands = [
        {
            "flag": "--x",
            "value": "auto",
            "status": "no-op",
            "note": "server.tp_size > 1: fail",
            "priority": "high",
        },
        {"flag": "--y", "value": None, "status": "already-set", "note": "already 64", "priority": "low"},
    ]
    verdicts = {"--x": {"verdict": "applies", "summary": "read at a.py:1", "evidence": []}}
    trials = {"--x": {"trial": 1, "changes": ["--x auto"], "decision": "rolled_back", "why": "no_change"}}
    text = conclusion(cands, verdicts, trials, None, None)
    ruled = text.split("### Ruled out without a restart")[1].split("###")[0]
    assert "--x" not in ruled and "--y: ruled out (already 64)" in ruled
    assert "- trial 1 --x auto: rolled back" in text
    items = {i["id"]: i for i in _todo(cands, verdicts, trials, [])}
    assert items["--x"]["content"].startswith("trial --x auto: rolled_back")
    assert items["--y"]["content"].startswith("--y: ruled out (already-set")
    # one the code overruled but the budget left untried is listed as not tried, not as ruled out
    text = conclusion(cands, verdicts, {}, None, "budget spent", {"--x": 1})
    assert "- --x auto: budget spent" in text and "--x" not in text.split("### Ruled out")[1].split("###")[0]
    # before research answers, a playbook no-op is being researched, not ruled out
    assert _todo(cands, {}, {}, [])[0]["content"] == "research --x auto"


def test_the_time_line_splits_the_trials_from_research_and_the_restarts_from_the_measuring():
    from types import SimpleNamespace

    trials = [SimpleNamespace(seconds=200.4, deployed=True, planned_seconds=180.0),
              SimpleNamespace(seconds=99.8, deployed=True, planned_seconds=150.0)]  # fmt: skip
    runner = SimpleNamespace(launch_seconds=[6.0, 6.5, 7.0, 6.0, 8.0], trials=trials)
    phases = [("preflight and context", 2.2), ("baseline", 38.0), ("launch spread", 80.0),
              ("research, planning and trials", 340.0)]  # fmt: skip
    line = time_use(500.0, phases, runner, spread_restarts=2)
    assert line == (
        "time: preflight and context 2 s, baseline 38 s, launch spread 80 s (2 restarts 12 s), "
        "research and planning 40 s, trials 300 s (3 restarts 21 s; planned 330 s at their starts, "
        "300 s taken), final check 40 s; 500 s in all"
    )
    # a spread known already takes no time and is not listed; a dry run has no trials to split off
    known = time_use(
        100.0, [("baseline", 38.0), ("launch spread", 0.0), ("research, planning and trials", 40.0)], None, 0
    )
    assert known == "time: baseline 38 s, research, planning and trials 40 s, final check 22 s; 100 s in all"


def test_a_failed_starts_headline_quotes_the_servers_own_reason():
    from tools.bench.effect import headline

    why = (
        "failed to start: the server process exited (ConnectError: All connection attempts failed); the "
        "server said: AttributeError: 'TorchNativeAttnBackend' object has no attribute 'init_cpu_graph_state'"
    )
    line = headline({"decision": "rolled_back", "why": why})
    assert line == (
        "rolled back: failed to start: AttributeError: 'TorchNativeAttnBackend' object has no attribute "
        "'init_cpu_graph_state'"
    )
    assert (
        headline({"decision": "rolled_back", "why": "not established; more"})
        == "rolled back: not established"
    )
