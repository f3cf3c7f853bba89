"""Sessions written with the real transcript writer and real pydantic-ai agents, for the
transcripts tests (the shapes of the event data follow the agent's models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent.transcripts.transcript import Transcript

LEVELS = (1, 8, 64)


def sweep(tp: dict[int, float]) -> dict:
    """A SweepResult-shaped dump with the given output throughput per level."""
    levels = [
        {
            "max_concurrency": c,
            "num_prompts": 8,
            "completed": 8,
            "output_throughput": v,
            "mean_ttft_ms": 50.0 + c,
            "p99_itl_ms": 20.0 + c / 4,
        }
        for c, v in tp.items()
    ]
    return {"endpoint": "http://127.0.0.1:30000", "api": "completions", "levels": levels, "partial": False}


def _scripted(turns: list[list]) -> FunctionModel:
    state = {"i": 0}

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        parts = turns[min(state["i"], len(turns) - 1)]
        state["i"] += 1
        return ModelResponse(parts=parts)

    return FunctionModel(reply)


def write_session(directory: Path, *, truncate: bool = False) -> Path:
    """A complete `run` session: context, baseline, todo, research subagent, two trials, end."""
    t = Transcript.create(directory, kind="run", goal="improve throughput", model="builtin", target="sim")
    t.event(
        "context",
        {
            "version": "0.5.23",
            "hardware": {
                "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}] * 8,
                "interconnect": "NVLink",
            },
            "model": {
                "architecture": "Qwen3MoeForCausalLM",
                "is_moe": True,
                "num_experts": 128,
                "experts_per_tok": 8,
            },
            "flags": {"--tp": "8", "--mem-fraction-static": "0.85"},
        },
    )
    t.event(
        "baseline",
        {"reps": [sweep({1: 100.0, 8: 700.0, 64: 2000.0}), sweep({1: 102.0, 8: 710.0, 64: 2040.0})]},
    )
    todo = [
        {"id": "cg", "content": "research --cuda-graph-max-bs", "status": "pending", "priority": "high"},
        {"id": "tc", "content": "research --enable-torch-compile", "status": "pending", "priority": "medium"},
    ]
    t.event("todo", {"items": todo})
    planner = Agent(
        _scripted(
            [
                [
                    TextPart("Two candidates; researching."),
                    ToolCallPart("research_flag", {"flag": "--cuda-graph-max-bs"}, "r1"),
                ],
                [
                    ToolCallPart(
                        "run_trial", {"changes": [{"flag": "--cuda-graph-max-bs", "value": "256"}]}, "t1"
                    )
                ],
                [TextPart("Kept --cuda-graph-max-bs 256; torch compile regressed.")],
            ]
        ),
        name="planner",
    )

    @planner.tool_plain
    def research_flag(flag: str) -> str:
        """Research one flag."""
        return "applies: " + "x" * 900

    @planner.tool_plain
    def run_trial(changes: list[dict]) -> str:
        """Run one trial."""
        return "kept"

    result = planner.run_sync("improve throughput")
    msgs = result.new_messages()
    nums = t.add_messages(msgs[:2])
    researcher = Agent(
        _scripted([[TextPart("model_runner.py:412 reads cuda_graph_max_bs")]]), name="researcher"
    )
    t.add_messages(
        researcher.run_sync("research --cuda-graph-max-bs").new_messages(),
        agent="researcher:--cuda-graph-max-bs",
        parent=nums[1],
    )
    t.event(
        "verdict",
        {
            "flag": "--cuda-graph-max-bs",
            "verdict": "applies",
            "summary": "captured batch sizes",
            "evidence": [
                {
                    "location": "python/sglang/srt/model_executor/model_runner.py:412",
                    "quote": "if self.server_args.cuda_graph_max_bs:",
                }
            ],
            "conditions": [
                {"condition": "bs <= 256", "fact": "max_running_requests = 256", "outcome": "pass"}
            ],
            "expected_effect": "+throughput at high concurrency",
            "risk": "memory",
        },
        msg=nums[1],
    )
    rest = t.add_messages(msgs[2:])
    t.event(
        "trial",
        {
            "number": 1,
            "kind": "single",
            "changes": [{"flag": "--cuda-graph-max-bs", "value": "256", "action": "set"}],
            "reason": "verdict applies",
            "decision": "kept",
            "why": "improved: +12.0% at 64",
            "comparison": {"verdict": "improved", "ratio": 1.12},
            "levels": {"1": 101.0, "8": 760.0, "64": 2270.0},
        },
        msg=rest[0],
    )
    t.event(
        "trial",
        {
            "number": 2,
            "kind": "single",
            "changes": [{"flag": "--enable-torch-compile", "value": None, "action": "set"}],
            "decision": "rolled_back",
            "why": "regressed: -8.0% at 64",
            "comparison": {"verdict": "regressed", "ratio": 0.92},
            "levels": {"1": 95.0, "8": 640.0, "64": 1860.0},
        },
    )
    t.event("todo", {"items": [{**todo[0], "status": "completed"}, {**todo[1], "status": "cancelled"}]})
    t.close({"kept": ["--cuda-graph-max-bs 256"], "gain": {"64": 1.12}, "status": "done"})
    if truncate:
        text = t.path.read_text()
        t.path.write_text(text[: text.rindex('{"type": "event", "kind": "trial"') + 40])
    return t.path


def _reps(tp: dict[int, float], spread: list[float]) -> list:
    """Repetitions of one block as `SweepResult`s: `tp` scaled by each factor of `spread`."""
    from tools.bench.results import SweepResult

    return [SweepResult.model_validate(sweep({c: v * f for c, v in tp.items()})) for f in spread]


def paired_trial(
    number: int,
    flag: str,
    known_good: dict[int, float],
    gain: dict[int, float],
    *,
    kept: bool,
    on_top_of: list | None = None,
) -> Any:
    """A `TrialRecord` judged by the real A/B/A comparison (`paired_compare`) on known-good blocks
    around `known_good` and a candidate block `known_good * gain`, with its samples recorded."""
    from agent.trial.record import TrialChange, TrialRecord, block_samples, comparison_dict, mean_throughput
    from tools.bench.objective import objective_from_goal
    from tools.bench.paired import paired_compare

    before = _reps(known_good, [0.99, 1.0, 1.01])
    after = _reps(known_good, [0.995, 1.005, 1.0])
    cand = _reps({c: v * gain[c] for c, v in known_good.items()}, [0.99, 1.01, 1.0])
    cmp = paired_compare(before, cand, after, objective_from_goal("improve throughput"))
    record = TrialRecord(
        number=number, changes=[TrialChange(flag=flag, value="64")], on_top_of=on_top_of or [],
        reason="research: applies", decision="kept" if kept else "rolled_back", improved=kept,
        why=cmp.summary, comparison=comparison_dict(cmp), levels=mean_throughput(cand), deployed=True,
        restarts=1 if kept else 2, seconds=519.332900272, probe="identical",
        blocks={"before": 3, "candidate": 3, "after": 3},
        samples={n: block_samples(b, ["output_throughput"]) for n, b in
                 (("before", before), ("candidate", cand), ("after", after))},
    )  # fmt: skip
    assert (cmp.verdict == "improved") == kept, cmp.summary
    return record


def write_paired_run(directory: Path, *, open_end: bool = False) -> tuple[Any, list]:
    """A saved run as the agent writes it: a baseline measured under other load (c=1 higher than
    the trials later saw), one regressed trial, one kept trial decided by the real paired rule.
    `open_end`: a second kept trial on top of the first, no final event and no end yet (the
    `Transcript` is returned, as the run has it when it writes its report)."""
    from agent.trial.record import TrialChange

    t = Transcript.create(directory, kind="run", goal="improve throughput", model="builtin", target="sim")
    t.event("approval", {"yes": False, "dry_run": False, "allow_lossy": False, "simulated": True})
    t.event("context", {"version": "0.5.23", "flags": {"--tp-size": "4"}})
    t.event("baseline", {"reps": [sweep({1: 127.5, 8: 700.0, 64: 2300.0})] * 3})
    known_good = {1: 120.0, 8: 690.0, 64: 2310.0}
    lost = paired_trial(1, "--speculative-num-steps", known_good, {1: 0.8, 8: 0.9, 64: 0.86}, kept=False)
    won = paired_trial(2, "--cuda-graph-max-bs-decode", known_good, {1: 1.0, 8: 0.995, 64: 1.05}, kept=True)
    trials = [lost, won]
    if open_end:
        on_top = {1: 120.0, 8: 687.0, 64: 2425.0}
        trials.append(paired_trial(3, "--enable-mixed-chunk", on_top, {1: 1.0, 8: 1.0, 64: 1.04}, kept=True,
                                   on_top_of=won.changes))  # fmt: skip
    for record in trials:
        t.event("trial", record.model_dump(mode="json"))
    assert won.changes == [TrialChange(flag="--cuda-graph-max-bs-decode", value="64")]
    if open_end:
        return t, trials
    t.event("final", {"reps": [sweep({1: 120.2, 8: 685.0, 64: 2323.0})]})
    t.close({"kept": [c.describe() for c in won.full_changes()], "status": "completed"})
    return t.path, trials
