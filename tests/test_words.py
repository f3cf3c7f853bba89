"""Words that mean one thing: conditions as a person writes them, "already set" only for what is
set, and one reason per candidate in the report."""

from __future__ import annotations

from agent.policy.playbook import PLAYBOOK_PATH, evaluate, load_playbook
from agent.session import RunResult
from agent.transcripts.report import render_report
from agent.transcripts.verdicts import condition_outcome, plain_condition


def test_conditions_read_as_a_person_writes_them() -> None:
    assert plain_condition("not server.disable_cuda_graph", "not = False", "pass") == (
        "server.disable_cuda_graph is off (here False): holds"
    )
    assert plain_condition("not not cfg.prefill_only_disable_kv_cache",
                           "server.prefill_only_disable_kv_cache = False", "fail") == (
        "server.prefill_only_disable_kv_cache is on (here False): does not hold"
    )  # fmt: skip
    assert plain_condition(
        "not cfg.kv_cache_dtype not in ('nvfp4',)", "server.kv_cache_dtype = 'auto'", "fail"
    ) == ("server.kv_cache_dtype in ('nvfp4',) (here 'auto'): does not hold")
    assert plain_condition("topk > 2", "model.experts_per_tok = 8", "pass") == (
        "topk > 2 (here model.experts_per_tok = 8): holds"
    )
    assert [condition_outcome(plain_condition("x", "x = 1", o)) for o in ("pass", "fail", "unknown")] == [
        "pass", "fail", "unknown",
    ]  # fmt: skip


def test_already_set_only_for_what_is_set_and_no_pass_word_to_invert() -> None:
    facts = {"gpu.sm": 120, "server.tp_size": 4, "server.attention_backend": "triton",
             "model.attention_kinds_has_linear": True, "flag.max_running_requests": 64}  # fmt: skip
    by_flag = {c.change: c for c in evaluate(load_playbook(PLAYBOOK_PATH), facts)}
    unset = by_flag["unset --enforce-disable-flashinfer-allreduce-fusion"]
    assert unset.ruled_out == "nothing to remove: --enforce-disable-flashinfer-allreduce-fusion is not set"
    assert by_flag["--max-running-requests"].ruled_out == "--max-running-requests is already set to 64"
    fa3 = by_flag["--attention-backend fa3"]
    assert fa3.ruled_out == "incompatible: not usable when gpu.sm not in [80, 86, 89, 90] (here 120)"
    for c in by_flag.values():
        assert not c.ruled_out.endswith((": pass", ": fail")), c.ruled_out
        assert ("already set" in c.ruled_out) == (c.change == "--max-running-requests"), c.ruled_out


def test_the_report_gives_each_candidate_one_reason() -> None:
    conclusion = (
        "## Conclusion\n\nNo change beat the baseline.\n\n### Trials\n- none\n\n"
        "### Ruled out without a restart\n- --attention-backend: refuses-to-start — FA3 needs SM90\n\n"
        "### Not tried\n- none"
    )
    result = RunResult(
        status="completed", conclusion=conclusion,
        untried={"--attention-backend fa3": "research: refuses-to-start — FA3 needs SM90"},
    )  # fmt: skip
    text = render_report(result, plot_name=None)
    assert text.count("--attention-backend") == 1, text
