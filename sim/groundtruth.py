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

LEVERS: dict[str, list[list[str]]] = {
    "b200-gptoss120b": [
        ["--cuda-graph-max-bs-decode", "64"],
        ["--max-running-requests", "128"],
        ["--moe-runner-backend", "triton_kernel"],
        ["--moe-runner-backend", "triton"],
        ["--enable-fused-moe-sum-all-reduce"],
        ["--attention-backend", "triton"],
        ["--attention-backend", "flashinfer"],
        ["--attention-backend", "fa3"],
        ["--kv-cache-dtype", "fp8_e4m3"],
        _SPEC,
        ["--disable-cuda-graph"],
        ["--tp-size", "2"],
        ["--quantization", "fp8"],
    ],
    "h100x4-llama70b": [
        ["--enable-flashinfer-allreduce-fusion"],
        ["--chunked-prefill-size", "8192"],
        ["--enable-mixed-chunk"],
        ["--attention-backend", "flashinfer"],
        ["--attention-backend", "triton"],
        ["--kv-cache-dtype", "fp8_e4m3"],
        ["--quantization", "fp8"],
        _SPEC,
        ["--disable-cuda-graph"],
        ["--mem-fraction-static", "0.95"],
        ["--moe-runner-backend", "flashinfer_trtllm"],
        ["--quantization", "awq"],
    ],
    "rtx6000-qwen235b-fp8": [
        ["--max-running-requests", "64"],
        ["--cuda-graph-max-bs-decode", "64"],
        ["--enable-fused-moe-sum-all-reduce"],
        ["--attention-backend", "triton"],
        ["--kv-cache-dtype", "fp8_e4m3"],
        _SPEC,
        ["--disable-cuda-graph"],
        ["--enable-flashinfer-allreduce-fusion"],
        ["--moe-runner-backend", "flashinfer_mxfp4"],
        ["--quantization", "awq"],
        ["--mem-fraction-static", "0.6"],
    ],
}


def _pct(new: float, base: float) -> str:
    return f"{(new / base - 1) * 100:+.1f}%"


def lever_effect(scenario: str, flags: list[str], base: list[float]) -> str:
    """One table cell: the change at each level, or why the server does not serve."""
    try:
        _, _, plan = plan_for(scenario, flags)
    except StartupError as e:
        return f"**refuses**: {str(e).splitlines()[0]}"
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
        "| flag | effect (c=1 / 8 / 64) |",
        "|---|---|",
    ]
    for flags in LEVERS.get(scenario, []):
        shown = " ".join(flags) if flags is not _SPEC else "EAGLE, 3 steps, topk 1, 4 draft tokens"
        lines.append(f"| `{shown}` | {lever_effect(scenario, flags, base)} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Print the tables of the named scenarios (default: all with a lever list)."""
    for name in argv or list(LEVERS):
        print(table(name), end="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
