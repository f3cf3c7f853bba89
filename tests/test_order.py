"""Which candidate the builtin planner trials next (agent/policy/order.py): expected value per restart for
untried candidates, and one second look at a near miss ranked by what was measured."""

from __future__ import annotations

from agent.policy.order import expected_value, second_look_value
from agent.policy.trialqueue import next_trials


def cand(flag: str, priority: str = "medium", status: str = "candidate") -> dict:
    return {"flag": flag, "value": None, "action": "set", "priority": priority, "status": status}


APPLIES = {"verdict": "applies"}


def test_untried_candidates_go_by_certainty_gain_and_restart_cost():
    cands = [cand("--low", "low"), cand("--enable-torch-compile"), cand("--high", "high"), cand("--unsure")]
    verdicts = {
        "--low": APPLIES,
        "--enable-torch-compile": APPLIES,
        "--high": APPLIES,
        "--unsure": {"verdict": "unknown"},
    }
    order = [c["flag"] for c, why in next_trials(cands, verdicts, {})]
    # high 0.8 x 6%; unknown 0.4 x 4% ties with torch.compile's 0.8 x 4% over two restarts and
    # with low 0.8 x 2%: ties keep the given order
    assert order == ["--high", "--low", "--enable-torch-compile", "--unsure"]
    assert expected_value(cands[1], APPLIES) == expected_value(cands[0], APPLIES)


def test_a_near_miss_gets_one_second_look_ranked_by_its_measured_estimate():
    cands = [cand("--a"), cand("--b", "low"), cand("--c")]
    verdicts = {f: APPLIES for f in ("--a", "--b", "--c")}
    miss = {"concurrency": 8, "ratio": 1.05, "ci_low": 1.01, "ci_high": 1.09, "launches_candidate": 2}
    tried = {"--a": [{"decision": "rolled_back", "near_miss": miss}], "--c": [{"decision": "rolled_back"}]}
    queue = next_trials(cands, verdicts, tried)
    # +5% measured, almost surely above 0: worth more than an untried low-priority lever (0.8 x 2%)
    assert [(c["flag"], why) for c, why in queue] == [
        ("--a", "second look at a near miss"),
        ("--b", "untried"),
    ]
    assert 0.045 < second_look_value(cands[0], miss) < 0.05
    # a weak one (+1.6%, interval from -1% to +4%) ranks after it; a second look is given once only
    weak = {**miss, "ratio": 1.016, "ci_low": 0.99, "ci_high": 1.04}
    tried["--a"] = [{"near_miss": weak}]
    assert [c["flag"] for c, _ in next_trials(cands, verdicts, tried)] == ["--b", "--a"]
    tried["--a"].append({"decision": "rolled_back", "near_miss": weak})
    assert [c["flag"] for c, _ in next_trials(cands, verdicts, tried)] == ["--b"]


def test_a_malformed_near_miss_is_worth_nothing():
    assert second_look_value(cand("--a"), {"ratio": 1.03}) == 0.0
    assert second_look_value(cand("--a"), {"ratio": 1.03, "ci_low": 1.05, "ci_high": 1.01}) == 0.0


def _history(cands: list[dict], verdicts: dict, trials: list[tuple[str, dict]]) -> list:
    """The builtin planner's messages after list_candidates, the research and `trials` ((flag,
    run_trial result) in order)."""
    from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart

    research = [ToolCallPart("todo_write", {"items": []}, tool_call_id="todo")]
    research += [ToolCallPart("research_flag", {"flag": f}, tool_call_id=f) for f in verdicts]
    returns = [ToolReturnPart("todo_write", "ok", tool_call_id="todo")]
    returns += [ToolReturnPart("research_flag", v, tool_call_id=f) for f, v in verdicts.items()]
    history = [
        ModelRequest(parts=[UserPromptPart("go")]),
        ModelResponse(parts=[ToolCallPart("list_candidates", {}, tool_call_id="c")]),
        ModelRequest(parts=[ToolReturnPart("list_candidates", cands, tool_call_id="c")]),
        ModelResponse(parts=research),
        ModelRequest(parts=returns),
    ]
    for i, (flag, result) in enumerate(trials):
        call = ToolCallPart("run_trial", {"changes": [{"flag": flag}], "reason": "r"}, tool_call_id=f"t{i}")
        back = ToolReturnPart("run_trial", result, tool_call_id=f"t{i}")
        history += [ModelResponse(parts=[call]), ModelRequest(parts=[back])]
    return history


def _calls(response) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {p.tool_name: p.args_as_dict() for p in response.parts if hasattr(p, "tool_name")}


def test_the_builtin_planner_takes_a_second_look_once_and_reports_both_trials():
    from pydantic_ai.messages import ModelRequest, ToolReturnPart

    from agent.policy.builtin.policy import planner_policy

    extra = {"note": "", "lossy": False, "helps": "h"}
    cands = [{**cand("--a", "high"), **extra}, {**cand("--b", "low"), **extra}]
    verdicts = {f: {"flag": f, "verdict": "applies", "summary": "read here"} for f in ("--a", "--b")}
    miss = {"concurrency": 8, "ratio": 1.05, "ci_low": 1.01, "ci_high": 1.09, "launches_candidate": 2}
    first = {
        "trial": 1,
        "changes": ["--a"],
        "decision": "rolled_back",
        "why": "not established",
        "near_miss": miss,
    }
    other = {"trial": 2, "changes": ["--b"], "decision": "rolled_back", "why": "no_change", "near_miss": None}
    run = _calls(planner_policy(_history(cands, verdicts, [("--a", first), ("--b", other)]), None))[
        "run_trial"
    ]
    assert run["changes"][0]["flag"] == "--a"
    assert run["reason"] == "second look at a near miss: not established"
    # its second trial is not established either: no third look; the final todo, then the conclusion
    again = {**first, "trial": 3, "why": "not established over 3 launches"}
    history = _history(cands, verdicts, [("--a", first), ("--b", other), ("--a", again)])
    todo = planner_policy(history, None)
    assert set(_calls(todo)) == {"todo_write"}
    history += [todo, ModelRequest(parts=[ToolReturnPart("todo_write", "ok", tool_call_id="final")])]
    text = planner_policy(history, None).parts[0].content
    trials = text.split("### Trials")[1].split("###")[0]
    assert [line.split(":")[0] for line in trials.strip().splitlines()] == [
        "- trial 1 --a",
        "- trial 2 --b",
        "- trial 3 --a",
    ]


def test_a_doubtful_rejection_is_tried_after_the_sure_candidates_and_a_sure_one_never():
    from agent.policy.builtin.policy import trial_queue
    from agent.policy.verdict import FlagVerdict

    def code(verdict: str, certainty: float) -> dict:
        return {"verdict": verdict, "decided_by": "code", "certainty": certainty, "summary": "s"}

    doubtful = code("refuses-to-start", 0.55)  # rests on a guard research could not evaluate
    verdicts = {
        "--sure-refusal": code("refuses-to-start", 0.9),
        "--doubtful-refusal": doubtful,
        "--doubtful-noop": code("no-op", 0.55),
        "--applies": code("applies", 0.9),
        "--runtime-applies": code("applies", 0.55),
    }
    cands = [{**cand(f), "lossy": False, "helps": "h"} for f in verdicts]
    queue = [c["flag"] for c, _ in trial_queue(cands, verdicts, {})]
    assert queue == ["--applies", "--runtime-applies", "--doubtful-refusal", "--doubtful-noop"]
    assert (
        FlagVerdict(flag="--x", summary="s", **{k: v for k, v in doubtful.items() if k != "summary"}).rejected
        is False
    )
    assert FlagVerdict(
        flag="--x", verdict="refuses-to-start", decided_by="code", certainty=0.9, summary="s"
    ).rejected
    # a playbook's own rule is not a code guess: its refusal stands
    assert FlagVerdict(
        flag="--x", verdict="refuses-to-start", decided_by="playbook", certainty=0.5, summary="s"
    ).rejected


def test_a_trial_the_machine_disturbed_gets_one_retry_and_no_more():
    cands = [cand("--a", "high"), cand("--b", "low")]
    verdicts = {"--a": APPLIES, "--b": APPLIES}
    disturbed = {"trial": 1, "decision": "rolled_back", "disturbed": {"concurrency": 64, "drift": 1.2}}
    queue = next_trials(cands, verdicts, {"--a": [disturbed]})
    assert [(c["flag"], why.split(":")[0]) for c, why in queue] == [("--a", "retry"), ("--b", "untried")]
    assert next_trials(cands, verdicts, {"--a": [disturbed, disturbed]})[0][0]["flag"] == "--b"
    assert [c["flag"] for c, _ in next_trials(cands, verdicts, {"--a": [disturbed, disturbed]})] == ["--b"]
