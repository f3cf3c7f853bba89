"""Ground-truth tables of sim/README.md: what each lever does to a scenario, from the noise-free model.

    python -m sim.groundtruth                       # every scenario that has a lever list
    python -m sim.groundtruth b200-gptoss120b       # one scenario

Each row is the change in output tok/s at concurrency 1 / 8 / 64 (1024 in, 256 out, ignore_eos),
"refuses: ..." when SGLang would not start, "crash" when a forward runs out of activation memory,
and a lossy marker when the output would change.
"""

from __future__ import annotations

import sys

from sim.offline import offline_throughput, plan_for
from sim.plan import StartupError
from sim.scheduler import OutOfMemory

LEVELS = (1, 8, 64)
_SPEC = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "/models/draft"]
_SPEC += [
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
]

# (flags, why) per scenario; "why" cites the SGLang 0.5.23 rule or the physics behind the effect.
LEVERS: dict[str, list[tuple[list[str], str]]] = {
    "b200-gptoss120b": [
        (["--cuda-graph-max-bs-decode", "64"], "baseline graphs stop at 32: batch 64 runs eager"),
        (["--max-running-requests", "128"], "no queue at c <= 64"),
        (["--moe-runner-backend", "triton_kernel"], "MXFP4 dequantized to BF16: experts at the BF16 rate"),
        (["--moe-runner-backend", "triton"], "same physics as triton_kernel here"),
        (["--enable-fused-moe-sum-all-reduce"], "the MoE runs flashinfer_mxfp4, not Triton: inert"),
        (["--attention-backend", "triton"], "slower KV reads; only 18 full-attention layers"),
        (["--attention-backend", "flashinfer"], "model_hook.py: gpt-oss needs sinks support"),
        (["--attention-backend", "fa3"], "attention_registry.py: FA3 is SM80-SM90 only"),
        (["--kv-cache-dtype", "fp8_e4m3"], "KV is a small share (GQA 8 heads x 64, half the layers slide)"),
        (_SPEC, "verify tokens wake more of the 128 experts at small batch"),
        (["--disable-cuda-graph"], "eager launches (c=64 already runs eager)"),
        (["--tp-size", "2"], "one GPU"),
        (["--quantization", "fp8"], "model_config.py _verify_quantization: checkpoint is mxfp4"),
    ],
    "h100x4-llama70b": [
        (["--enable-flashinfer-allreduce-fusion"], "Llama is not auto-enabled; SM90 supports it"),
        (["--chunked-prefill-size", "8192"], "fewer prefill chunks"),
        (["--enable-mixed-chunk"], "prefill chunks ride along decode"),
        (["--attention-backend", "flashinfer"], "fa3 is the Hopper default; flashinfer slightly slower"),
        (["--attention-backend", "triton"], "slower KV reads"),
        (["--kv-cache-dtype", "fp8_e4m3"], "halves KV reads"),
        (["--quantization", "fp8"], "online FP8: half the weight bytes, FP8 tensor cores"),
        (_SPEC, "dense: gain shrinks with batch"),
        (["--disable-cuda-graph"], "eager launches at every batch"),
        (["--mem-fraction-static", "0.95"], "too little activation memory left"),
        (["--moe-runner-backend", "flashinfer_trtllm"], "dense model: no MoE"),
        (["--quantization", "awq"], "a BF16 checkpoint has no packed int4 tensors"),
    ],
    "a100x2-mixtral": [
        (["--enable-mixed-chunk"], "prefill chunks ride along decode"),
        (["--enable-torch-compile"], "fewer kernel launches at small batch"),
        (["--chunked-prefill-size", "8192"], "fewer prefill chunks"),
        (["--cuda-graph-max-bs-decode", "64"], "graphs already capture up to 256"),
        (["--attention-backend", "fa3"], "0.5.23's FA3 assert allows SM80; flashinfer is the Ampere default"),
        (["--attention-backend", "triton"], "slower KV reads"),
        (["--enable-fused-moe-sum-all-reduce"], "fused_moe.py: needs top-k > 2, Mixtral routes to 2"),
        (["--enable-flashinfer-allreduce-fusion"], "flashinfer_comm_fusion.py: SM90/SM10X only"),
        (["--kv-cache-dtype", "fp8_e4m3"], "halves KV reads"),
        (["--quantization", "fp8"], "online FP8 weights (W8A16 on Ampere): half the weight bytes"),
        (["--disable-cuda-graph"], "eager launches at every batch"),
        (["--moe-runner-backend", "flashinfer_trtllm"], "SM100 only"),
    ],
    "h200x8-deepseekv3": [
        (["--enable-mixed-chunk"], "prefill chunks ride along decode"),
        (["--chunked-prefill-size", "8192"], "fewer prefill chunks"),
        (["--enable-fused-moe-sum-all-reduce"], "active: Triton fused_moe (FP8 block scales), top-8"),
        (["--enable-torch-compile"], "launch overhead is a small share of a 61-layer step"),
        (["--attention-backend", "fa3"], "already the resolved MLA backend on Hopper"),
        (["--enable-flashinfer-allreduce-fusion"], "auto-enabled for DeepseekV3ForCausalLM on SM90"),
        (["--quantization", "fp8"], "the checkpoint is already block FP8"),
        (["--kv-cache-dtype", "fp8_e4m3"], "MLA's latent KV is already small"),
        (_SPEC, "MoE: the draft's extra tokens are cheap at this step cost"),
        (["--disable-cuda-graph"], "eager launches at every batch"),
        (["--moe-runner-backend", "flashinfer_trtllm"], "SM100 only"),
    ],
    "rtx6000-qwen235b-fp8": [
        (["--max-running-requests", "64"], "baseline queues at 48"),
        (["--cuda-graph-max-bs-decode", "64"], "batch never exceeds 48 here"),
        (["--enable-fused-moe-sum-all-reduce"], "active: Triton fused_moe (FP8 block scales), top-8"),
        (["--attention-backend", "triton"], "flashinfer is the SM120 default"),
        (["--kv-cache-dtype", "fp8_e4m3"], "KV is a small share at 1k context"),
        (_SPEC, "MoE: dips at small batch, peaks at medium batch"),
        (["--disable-cuda-graph"], "eager launches at every batch"),
        (["--enable-flashinfer-allreduce-fusion"], "flashinfer_comm_fusion.py: SM90/SM10X only"),
        (["--moe-runner-backend", "flashinfer_mxfp4"], "needs an MXFP4 checkpoint"),
        (["--quantization", "awq"], "model_config.py _verify_quantization: checkpoint is fp8"),
        (["--mem-fraction-static", "0.55"], "59 GB of FP8 weights per GPU do not fit in 0.55 x 96 GB"),
    ],
}


def _pct(new: float, base: float) -> str:
    return f"{(new / base - 1) * 100:+.1f}%"


def lever_effect(scenario: str, flags: list[str], base: list[float]) -> str:
    """One table cell: the change at each level, or why the server does not serve."""
    try:
        _, _, plan = plan_for(scenario, flags)
    except StartupError as e:
        return f"**refuses**: {str(e).splitlines()[0][:110]}"
    try:
        tps = [offline_throughput(scenario, flags, concurrency=c) for c in LEVELS]
    except OutOfMemory:
        return "**crash** under load (CUDA OOM)"
    cells = " / ".join(_pct(t, b) for t, b in zip(tps, base, strict=True))
    if all(abs(t / b - 1) < 0.0005 for t, b in zip(tps, base, strict=True)):
        cells = "no-op"
    return cells + (f", **lossy** ({plan.lossy})" if plan.lossy else "")


def table(scenario: str) -> str:
    """The markdown baseline line and lever table of one scenario."""
    scn, model, plan = plan_for(scenario)
    base = [offline_throughput(scenario, concurrency=c) for c in LEVELS]
    lines = [
        f"### {scn.name} — {scn.description}",
        "",
        f"Resolved: attention `{plan.attention_backend}`, MoE kernel `{plan.moe_runner}`, "
        f"weights {plan.weight_bytes_per_gpu / 2**30:.1f} GiB/GPU, KV pool "
        f"{plan.kv_budget_bytes / 2**30:.1f} GiB/GPU.",
        "",
        "Baseline: " + " / ".join(f"{b:.0f}" for b in base) + " tok/s.",
        "",
        "| flag | effect (c=1 / 8 / 64) | why |",
        "|---|---|---|",
    ]
    for flags, why in LEVERS.get(scenario, []):
        shown = " ".join(flags) if flags is not _SPEC else "EAGLE draft, 3 steps, topk 1, 4 tokens"
        lines.append(f"| `{shown}` | {lever_effect(scenario, flags, base)} | {why} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Print the tables of the named scenarios (default: all with a lever list)."""
    for name in argv or list(LEVERS):
        print(table(name), end="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
