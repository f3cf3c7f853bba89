"""The research subagent with the builtin policy on the real SGLang 0.5.23 source: verdicts follow
the code and this deployment's facts (same flag, different model -> different verdict)."""

from __future__ import annotations

import asyncio

from agent.context import DeploymentContext
from agent.policy.models import ModelChoiceError, choose_model, make_models
from agent.policy.researcher import ResearchDeps, build_researcher
from tools.research.flags import flag_catalog


def _ctx(tree, *, experts_per_tok: int, tp: int) -> DeploymentContext:
    model = {"is_moe": experts_per_tok > 0, "experts_per_tok": experts_per_tok, "quantization": None}
    return DeploymentContext(
        server_info={"tp_size": tp, "attention_backend": "triton"},
        version="0.5.23",
        model=model,
        tree=tree,
        catalog={
            f"--{f.name.lstrip('-')}" if f.name.startswith("--") else f"--{f.name}": f
            for f in flag_catalog(tree)
        },
    )


def _verdict(ctx: DeploymentContext, flag: str):
    agent = build_researcher(make_models("builtin", None).researcher)
    result = asyncio.run(agent.run(f"Research the flag {flag}.", deps=ResearchDeps(ctx=ctx)))
    return result.output


def test_code_guard_decides_between_applies_and_noop(sglang_0523):
    flag = "--enable-fused-moe-sum-all-reduce"
    top8 = _verdict(_ctx(sglang_0523, experts_per_tok=8, tp=4), flag)
    assert top8.verdict == "applies"
    assert any(e.location.endswith("fused_moe.py:635") for e in top8.evidence)
    assert any(c.condition == "topk > 2" and c.outcome == "pass" and "8" in c.fact for c in top8.conditions)
    top2 = _verdict(_ctx(sglang_0523, experts_per_tok=2, tp=4), flag)
    assert top2.verdict == "no-op"
    assert "topk > 2" in top2.summary


def test_dead_and_unknown_flags(sglang_0523):
    ctx = _ctx(sglang_0523, experts_per_tok=8, tp=4)
    dead = _verdict(ctx, "--num-continuous-decode-steps")
    assert dead.verdict == "dead" and dead.evidence[0].location.startswith("sglang/srt/arg_groups/fields/")
    missing = _verdict(ctx, "--no-such-flag-anywhere")
    assert missing.verdict == "incompatible-with-version" and "0.5.23" in missing.summary


def test_model_choice():
    assert choose_model(None, None) == ("builtin", None)
    assert choose_model("m", "http://127.0.0.1:1/v1") == ("m", "http://127.0.0.1:1/v1")
    try:
        choose_model("builtin", "http://127.0.0.1:1/v1")
    except ModelChoiceError as e:
        assert "--model" in str(e)
    else:
        raise AssertionError("builtin with a base URL must be refused")


def test_the_agents_research_asks_sglangs_own_start_up(sglang_0523):
    """Mixtral on 2 x A100 (SM80): the researcher's verdict on an alias that argument resolution
    turns into nothing and on a backend SGLang refuses comes from SGLang's own start-up run on the
    unit file's command line, the GPUs' facts and the model's config.json."""
    import json
    from pathlib import Path

    from agent.policy.researcher import flag_usage

    config = json.loads(
        (Path(__file__).parent / "data/model-configs/mistralai--Mixtral-8x7B-v0.1_config.json").read_text()
    )
    gpu = {"name": "NVIDIA A100-SXM4-80GB", "sm": 80, "memory_mib": 81920}
    ctx = DeploymentContext(
        unit_flags={"--model-path": "mistralai/Mixtral-8x7B-v0.1", "--tp-size": "2"},
        server_info={"tp_size": 2},
        version="0.5.23",
        model=None,
        model_config=config,
        hardware={"gpus": [gpu, gpu]},
        tree=sglang_0523,
        catalog={f.name: f for f in flag_catalog(sglang_0523)},
    )
    alias = flag_usage(ResearchDeps(ctx=ctx), "--enable-dp-attention")
    assert alias["code_verdict"] == "no-op" and alias["certainty"] >= 0.9, alias["code_summary"]
    assert "own argument resolution" in alias["code_summary"]
    startup = ctx.startup("--attention-backend", "trtllm_mha")
    assert startup.kind == "refused" and "requires Hopper" in startup.message
    # without the GPU's memory nothing is guessed: the code index alone decides
    ctx.hardware = {"gpus": [{"name": gpu["name"], "sm": 80}] * 2}
    assert ctx.startup("--enable-dp-attention", None).kind == "unknown"
