"""Which candidate the builtin planner trials next (agent/order.py): expected value per restart for
untried candidates, and one second look at a near miss ranked by what was measured."""

from __future__ import annotations

from agent.order import expected_value, next_trials, second_look_value


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
