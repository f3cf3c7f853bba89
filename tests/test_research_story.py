"""The user story's research on SM120, TP 4 (Qwen3.5-122B-A10B), through the researcher agent with
the builtin policy, on the real SGLang wheels; the playbook's SM rule is removed, so the GPU verdicts
can only come from the code. Also: the playbook is a prior the code overrules, and a verdict the
playbook decides alone says so."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.context import DeploymentContext
from agent.policy.models import make_models
from agent.policy.playbook import evaluate, load_playbook
from agent.policy.researcher import ResearchDeps, build_researcher
from agent.policy.verdict import FlagVerdict
from tools.research.flags import flag_catalog
from tools.research.target.modelcfg import load_model_config, model_facts

CONFIGS = Path(__file__).parent / "data" / "model-configs"


def _ctx(tree, sm: int = 120) -> DeploymentContext:  # type: ignore[no-untyped-def]
    model = model_facts(load_model_config(CONFIGS / "Qwen--Qwen3.5-122B-A10B_config.json"))
    return DeploymentContext(
        server_info={"tp_size": 4, "attention_backend": "triton"},
        version=tree.version if tree is not None else "0.5.23",
        model=model,
        hardware={"gpus": [{"name": "RTX PRO 6000 Blackwell", "sm": sm}] * 4},
        tree=tree,
        catalog={f.name: f for f in flag_catalog(tree)} if tree is not None else {},
    )


def _research(
    ctx: DeploymentContext, flag: str, *, without_sm_rule: bool = True, rule: list[str] | None = None
) -> FlagVerdict:
    """`rule`: the lever's playbook needs replaced by these (its conflicts dropped)."""
    levers = load_playbook()
    for lever in levers:
        if without_sm_rule:
            lever.conflicts = [c for c in lever.conflicts if "gpu.sm" not in c]
        if rule is not None and lever.flag == flag:
            lever.needs, lever.conflicts = rule, []
    candidates = {c.flag: c for c in evaluate(levers, ctx.facts, ctx.catalog or None)}
    agent = build_researcher(make_models("builtin", None).researcher)
    deps = ResearchDeps(ctx=ctx, candidates=candidates)
    return asyncio.run(agent.run(f"Research the flag {flag}.", deps=deps)).output


def test_fused_moe_sum_applies_because_topk_8_is_above_2(sglang_0523):
    v = _research(_ctx(sglang_0523), "--enable-fused-moe-sum-all-reduce")
    assert v.verdict == "applies" and v.decided_by == "code" and not v.rejected
    assert any(
        e.location == "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py:635" for e in v.evidence
    )
    topk = next(c for c in v.conditions if c.condition == "topk > 2")
    assert topk.outcome == "pass" and "model.experts_per_tok = 8" in topk.fact


def test_flashinfer_fusion_refuses_to_start_in_0523_from_the_code(sglang_0523):
    v = _research(_ctx(sglang_0523), "--enable-flashinfer-allreduce-fusion")
    assert v.verdict == "refuses-to-start" and v.decided_by == "code" and v.rejected
    assert "requires SM90 or SM10X" in v.summary and "flashinfer_comm_fusion.py:49" in v.summary
    assert any(e.location == "sglang/srt/layers/flashinfer_comm_fusion.py:49" for e in v.evidence)
    # the same research on an SM90 host: the raise does not fire, the fusion applies
    assert _research(_ctx(sglang_0523, sm=90), "--enable-flashinfer-allreduce-fusion").verdict == "applies"


def test_flashinfer_fusion_is_a_silent_noop_in_059_from_the_code(sglang_059):
    v = _research(_ctx(sglang_059), "--enable-flashinfer-allreduce-fusion")
    assert v.verdict == "no-op" and v.decided_by == "code"
    assert "communicator.py:100" in v.summary and "gpu.sm = 120" in v.summary
    sm = next(c for c in v.conditions if c.condition == "_is_sm90_supported or _is_sm100_supported")
    assert sm.outcome == "fail"


def test_the_two_dead_flags(sglang_0523, sglang_059):
    for tree in (sglang_0523, sglang_059):
        v = _research(_ctx(tree), "--num-continuous-decode-steps")
        assert v.verdict == "dead" and v.rejected, (tree.version, v.summary)
    assert _research(_ctx(sglang_0523), "--triton-attention-reduce-in-fp32").verdict == "dead"
    old = _research(_ctx(sglang_059), "--triton-attention-reduce-in-fp32")
    assert old.verdict == "no-op" and "double_sparsity" in old.summary


def test_the_code_overrules_a_playbook_rule(sglang_0523):
    # a playbook rule that torch.compile is for dense models only; the code compiles the CUDA graphs
    # of any model
    v = _research(
        _ctx(sglang_0523), "--enable-torch-compile", without_sm_rule=False, rule=["not model.is_moe"]
    )
    assert v.verdict == "applies" and v.decided_by == "code"
    assert "overrules the playbook" in v.summary and "not model.is_moe" in v.summary


def test_a_playbook_rule_alone_is_labelled_as_such():
    # no source tree: only the playbook's SM rule can speak, and the verdict says so
    v = _research(_ctx(None), "--enable-flashinfer-allreduce-fusion", without_sm_rule=False)
    assert v.verdict == "refuses-to-start" and v.decided_by == "playbook"
    assert v.certainty <= 0.5 and "playbook rule alone" in v.summary
    assert _research(_ctx(None), "--enable-flashinfer-allreduce-fusion").verdict == "unknown"


def test_old_verdict_names_still_read():
    old = FlagVerdict(flag="--x", verdict="incompatible", summary="s")
    assert old.verdict == "incompatible-with-version" and old.rejected
    assert FlagVerdict(flag="--x", verdict="live", summary="s").verdict == "applies"


def test_fa3_on_blackwell_is_refused_by_the_code_and_a_playbook_refusal_is_not_overruled_by_silence(
    sglang_0523,
):
    # without the playbook's SM rule, the registry entry the value selects refuses (an assert)
    v = _research(_ctx(sglang_0523), "--attention-backend")
    assert v.verdict == "refuses-to-start" and v.decided_by == "code", v.summary
    assert "attention_registry.py:243" in v.summary and "SM>=80 and SM<=90" in v.summary


def test_a_playbook_refusal_stands_when_the_code_only_finds_a_running_reader():
    from agent.policy.builtin.research import decide_verdict

    lookup = {
        "sglang_version": "0.5.23",
        "in_catalog": True,
        "playbook": {"conflicts": [{"condition": "gpu.sm not in [90]", "actual": 120, "outcome": "pass"}]},
    }
    usage = {"code_verdict": "applies", "code_summary": "read at x.py:1.", "certainty": 0.9, "readers": []}
    v = FlagVerdict.model_validate(decide_verdict("--x", lookup, usage))
    assert v.verdict == "refuses-to-start" and v.decided_by == "playbook" and v.certainty == 0.5
    assert "no refusal within its reach" in v.summary
    # a playbook no-op claim is overruled by a running reader
    lookup["playbook"] = {"needs": [{"condition": "not model.is_moe", "actual": True, "outcome": "fail"}]}
    v = FlagVerdict.model_validate(decide_verdict("--x", lookup, usage))
    assert v.verdict == "applies" and v.decided_by == "code" and "overrules the playbook" in v.summary
