"""The simulator's flag parsing, flag semantics, performance model, scheduler and text (in-process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sim.args import parse_launch_args
from sim.offline import offline_throughput, plan_for
from sim.perf import PerfModel
from sim.plan import StartupError
from sim.scenario import ScenarioError, list_scenarios, load_scenario
from sim.scheduler import Request, Scheduler
from sim.text import TextStream, prompt_key, vocabulary

SEED_MODEL = str(load_scenario("seed").model_dir)


# -- flag parsing --------------------------------------------------------------------------------
def test_real_flag_names_types_and_aliases() -> None:
    args = parse_launch_args(
        ["--model-path", SEED_MODEL, "--tp", "4", "--mem-fraction-static", "0.8", "--context-length", "8k"]
        + ["--enable-flashinfer-allreduce-fusion", "--flashinfer-allreduce-fusion-backend", "trtllm"]
        + ["--moe-runner-backend", "triton", "--served-model-name", "m", "--trust-remote-code"]
    )
    assert (args.tp_size, args.mem_fraction_static, args.context_length) == (4, 0.8, 8000)
    assert args.enable_flashinfer_allreduce_fusion and args.flashinfer_allreduce_fusion_backend == "trtllm"
    assert parse_launch_args(["--model", SEED_MODEL, "--tensor-parallel-size", "2"]).tp_size == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--tp-size", "four"], "argument --tp-size/--tensor-parallel-size: invalid int value: 'four'"),
        (["--attention-backend", "cudnn"], "argument --attention-backend: invalid choice: 'cudnn'"),
        (["--moe-runner-backend", "fast"], "argument --moe-runner-backend: invalid choice: 'fast'"),
        # 0.5.23 split --cuda-graph-max-bs into -decode/-prefill; the old spelling is an ambiguous prefix.
        (["--cuda-graph-max-bs", "64"], "ambiguous option: --cuda-graph-max-bs could match"),
    ],
)
def test_bad_flags_exit_2_like_argparse(argv: list[str], message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        parse_launch_args(["--model-path", SEED_MODEL, *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: sglang serve") and f"sglang serve: error: {message}" in err


def test_cli_rejects_unknown_flag_with_status_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sim.cli", "launch_server", "--model-path", SEED_MODEL, "--bogus"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "unrecognized arguments: --bogus" in proc.stderr


# -- flag semantics (conditions from the SGLang 0.5.23 source) -------------------------------------
def test_fused_moe_sum_needs_triton_runner_and_topk_above_two() -> None:
    assert plan_for("seed", ["--enable-fused-moe-sum-all-reduce"])[2].fused_moe_sum
    assert not plan_for(
        "seed", ["--enable-fused-moe-sum-all-reduce", "--moe-runner-backend", "triton_kernel"]
    )[2].fused_moe_sum
    assert not plan_for("h100-llama8b", ["--enable-fused-moe-sum-all-reduce"])[2].fused_moe_sum  # dense


def test_flashinfer_allreduce_fusion_by_arch_and_tp() -> None:
    with pytest.raises(StartupError, match="requires SM90 or SM10X") as exc:
        plan_for("seed", ["--enable-flashinfer-allreduce-fusion"])  # SM120
    assert exc.value.after_load
    with pytest.raises(StartupError, match="requires SM90 or SM10X"):
        plan_for("seed", ["--flashinfer-allreduce-fusion-backend", "auto"])
    assert not plan_for("h100-llama8b", ["--enable-flashinfer-allreduce-fusion"])[2].ar_fusion  # TP 1
    # Qwen3MoE on SM90 with TP 2: auto-enabled unless enforce-disabled (the h200 baseline disables it).
    assert not plan_for("h200-qwen30b", ["--enable-flashinfer-allreduce-fusion"])[2].ar_fusion
    base = [f for f in load_scenario("h200-qwen30b").launch.flags if "enforce-disable" not in f]
    assert plan_for("h200-qwen30b", base, replace_baseline=True)[2].ar_fusion


@pytest.mark.parametrize(
    "flags", [["--triton-attention-reduce-in-fp32"], ["--num-continuous-decode-steps", "4"]]
)
def test_dead_flags_change_nothing(flags: list[str]) -> None:
    assert plan_for("seed", flags)[2] == plan_for("seed")[2]


@pytest.mark.parametrize(
    ("scenario", "flags", "message"),
    [
        ("seed", ["--attention-backend", "fa3"], "FlashAttention v3 Backend requires SM>=80 and SM<=90"),
        ("seed", ["--mem-fraction-static", "0.6"], "Not enough memory"),
        ("seed", ["--tp-size", "8"], "invalid device ordinal"),
        ("seed", ["--speculative-algorithm", "MEDUSA"], "Unknown speculative algorithm name: MEDUSA"),
        ("h200-qwen30b", ["--speculative-algorithm", "NEXTN"], "no MTP layers"),
        ("h100-llama8b", ["--moe-runner-backend", "flashinfer_trtllm", "--kv-cache-dtype", "nvfp4"], "SM100"),
    ],
)
def test_refusals(scenario: str, flags: list[str], message: str) -> None:
    with pytest.raises(StartupError, match=message):
        plan_for(scenario, flags)


def test_lossy_settings() -> None:
    assert plan_for("seed", ["--kv-cache-dtype", "fp8_e4m3"])[2].lossy == "drift"
    assert plan_for("h200-qwen30b", ["--dtype", "float16"])[2].lossy == "garbage"
    assert plan_for("h100-llama8b", ["--dtype", "float16"])[2].lossy is None
    assert plan_for("seed", ["--enable-torch-compile"])[2].hangs_in_warmup


# -- performance model ---------------------------------------------------------------------------
def test_seed_baseline_is_calibrated_to_the_session() -> None:
    assert offline_throughput("seed", concurrency=1) == pytest.approx(122, rel=0.10)
    assert offline_throughput("seed", concurrency=64) == pytest.approx(1583, rel=0.10)


def test_each_scenario_has_a_real_helper() -> None:
    helpers = {
        "seed": ["--cuda-graph-max-bs-decode", "64"],
        "h100-llama8b": ["--max-running-requests", "128"],
        "h200-qwen30b": ["--chunked-prefill-size", "8192"],
    }
    for name, flags in helpers.items():
        assert offline_throughput(name, flags, concurrency=64) > 1.05 * offline_throughput(
            name, concurrency=64
        )
    assert offline_throughput("seed", ["--disable-cuda-graph"], concurrency=1) < 0.9 * offline_throughput(
        "seed", concurrency=1
    )


def test_speculative_gain_shrinks_then_turns_into_a_loss() -> None:
    spec = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "/draft"]
    scn, model, with_spec = plan_for("h100-llama8b", spec)
    _, _, without = plan_for("h100-llama8b")
    a, b = PerfModel(with_spec, model, scn), PerfModel(without, model, scn)

    def gain(batch: int) -> float:
        ca, cb = a.decode_cost(batch, batch * 1200), b.decode_cost(batch, batch * 1200)
        return (ca.tokens_per_request / ca.seconds) / (cb.tokens_per_request / cb.seconds)

    assert gain(1) > gain(64) > gain(256) and gain(1) > 1.2 and gain(256) < 1.0


def test_scheduler_queues_at_max_running_requests() -> None:
    scn, model, plan = plan_for("seed", ["--max-running-requests", "2"])
    sched = Scheduler(PerfModel(plan, model, scn), plan, seed=0)
    reqs = [Request(prompt_len=100, max_new=50, stop_at=50) for _ in range(4)]
    for r in reqs:
        sched.add(r)
    sched.step()
    assert len(sched.running) == 2 and list(sched.waiting) == reqs[2:]
    while not reqs[0].done:
        sched.step()
        assert len(sched.running) <= 2
    while sched.has_work:
        sched.step()
    assert all(r.generated == 50 for r in reqs)


# -- scenarios -----------------------------------------------------------------------------------
def test_bundled_scenarios_load() -> None:
    assert {"seed", "h100-llama8b", "h200-qwen30b"} <= set(list_scenarios())
    for name in list_scenarios():
        assert (load_scenario(name).model_dir / "config.json").is_file()


def test_bad_scenario_names_the_key(tmp_path: Path) -> None:
    text = load_scenario("seed").source.read_text().replace("count = 4", "count = 0\nbogus = 1")  # type: ignore[union-attr]
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(bad)
    assert "hardware.count" in str(exc.value) and "hardware.bogus: unknown key" in str(exc.value)
    with pytest.raises(ScenarioError, match="unknown scenario 'nope'"):
        load_scenario("nope")


# -- text ----------------------------------------------------------------------------------------
def test_greedy_text_is_deterministic_and_drifts_or_breaks_when_lossy() -> None:
    key = prompt_key("Tell me about GPUs")
    ref = TextStream(key, greedy=True).next_text(60)
    assert TextStream(key, greedy=True).next_text(60) == ref
    assert TextStream(prompt_key("other"), greedy=True).next_text(60) != ref
    drift = TextStream(key, greedy=True, lossy="drift").next_text(60)
    words, dwords = ref.split(), drift.split()
    assert words[:6] == dwords[:6] and words != dwords
    garbage = TextStream(key, greedy=True, lossy="garbage").next_text(20).split()
    assert not set(garbage) & set(vocabulary())
