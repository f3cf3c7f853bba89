"""Research verdicts on the real SGLang 0.5.23, 0.5.15.post1, 0.5.9 and 0.4.9 wheels against hand-labelled
truths.

The truths, with the `path:line` each was read from, are in tests/data/research_labels.toml. The
deployments (tests/data/research_profiles.toml) are built from real model configs
(tests/data/model-configs) and GPU facts; no playbook
is involved: every verdict here comes from the code index (`tools.research.analysis`).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.research_profiles import PROFILES, case_id, case_startup, load_cases, profile_facts, taught_files
from tools.research.analysis import analyze_flag
from tools.research.callers import caller_gate
from tools.research.flag_index.serving_path import off_path_reason
from tools.research.index import load_index
from tools.research.verdict.calibration import recorded_cases

pytestmark = pytest.mark.server

CASES = load_cases()
TAUGHT = [(name, c) for name in taught_files() for c in load_cases(name)]
_VERDICTS: dict[str, Any] = {}
"""Each case researched once per process: the truth test and the calibration test share it."""


def _verdict(name: str, case: dict[str, Any], trees: dict[str, Any]) -> Any:
    key = case_id(name, case)
    if key not in _VERDICTS:
        tree = trees[case["version"]]
        _VERDICTS[key] = analyze_flag(
            load_index(tree),
            case["flag"],
            profile_facts(case["profile"]),
            value=case.get("value"),
            startup=case_startup(tree, case),
        )
    return _VERDICTS[key]


@pytest.fixture(scope="module")
def trees(sglang_0523, sglang_0515, sglang_059, sglang_049):  # type: ignore[no-untyped-def]
    return {"0.5.23": sglang_0523, "0.5.15.post1": sglang_0515, "0.5.9": sglang_059, "0.4.9": sglang_049}


def test_the_labelled_set_is_big_enough_and_covers_every_point() -> None:
    assert len({(c["version"], c["flag"], c["profile"], c.get("value")) for c in CASES}) >= 60
    assert len({c["profile"] for c in CASES}) >= 6
    covered = {item for c in CASES for item in c.get("covers", [])}
    for item in (
        "reachability",
        "guards",
        "platform",
        "dispatch",
        "aliases",
        "spellings",
        "dead",
        "vocabulary",
    ):
        assert item in covered, item
    assert {c["version"] for c in CASES} == {"0.5.23", "0.5.15.post1", "0.5.9", "0.4.9"}
    assert {c["profile"] for c in CASES} <= set(PROFILES)


def _cites(place: str, source: str) -> bool:
    """`place` (path:line) is within 3 lines of a line or range the label's `source` names
    (`path:12`, `path:12-15,40`, several joined by `; `)."""
    path, _, line = place.rpartition(":")
    for part in source.split(";"):
        src_path, _, spans = part.strip().rpartition(":")
        if src_path != path or not line.isdigit():
            continue
        for span in spans.split(","):
            low, _, high = span.partition("-")
            if int(low) - 3 <= int(line) <= int(high or low) + 3:
                return True
    return False


def _case(c: dict[str, Any]) -> Any:
    """A labelled case; one with a `gap` is a known miss, expected to fail until the gap is closed."""
    gap = pytest.mark.xfail(strict=True, reason=c["gap"]) if c.get("gap") else ()
    return pytest.param(c, marks=gap, id=f"{c['version']}-{c['profile']}-{c['flag']}")


@pytest.mark.parametrize("case", [_case(c) for c in CASES])
def test_verdict_matches_the_hand_read_truth(case: dict[str, Any], trees) -> None:  # type: ignore[no-untyped-def]
    verdict = _verdict("research_labels.toml", case, trees)
    assert verdict.verdict == case["verdict"], verdict.summary
    if ":" in case["source"] and verdict.verdict not in ("dead", "incompatible-with-version"):
        # the deciding line is in the evidence (a reader, or the exit it reaches)
        places = [f.location for f in verdict.findings] + [
            e.location for f in verdict.findings for e in f.exits
        ]
        assert any(_cites(p, case["source"]) for p in places), (places, case["source"])
    if verdict.verdict == "dead":
        assert case["source"].split(":")[0] == verdict.definition.split(":")[0]


@pytest.mark.parametrize("name,case", TAUGHT, ids=[case_id(n, c) for n, c in TAUGHT])
def test_each_taught_case_is_decided_as_the_calibration_file_records_it(name, case, trees) -> None:  # type: ignore[no-untyped-def]
    """tools/research/verdict/calibration.toml counts, for every taught case, the rule and basis research
    decides it by and whether it is right: certainties come from those counts, so a change of
    research or of a label that moves a case makes the file stale (issue 53 item 1). Whether the
    verdict is right is not asserted here (held-out cases are no targets), only that it is recorded."""
    v = _verdict(name, case, trees)
    now = f"{v.rule}/{v.basis} {'right' if v.verdict == case['verdict'] else 'wrong'}"
    recorded = recorded_cases().get(case_id(name, case))
    assert now == recorded, (
        f"research now decides it {now} ({v.verdict}), the calibration file says {recorded}: "
        "run python benchmarks/bench_research.py --calibrate"
    )


def test_no_evidence_off_the_serving_path(trees) -> None:  # type: ignore[no-untyped-def]
    """Benchmarks, tests, multimodal_gen and the api/ types are never readers (item 4)."""
    for tree in trees.values():
        index = load_index(tree)
        for f in index.catalog[:: max(1, len(index.catalog) // 120)]:
            for read in index.reads(f.dest):
                assert off_path_reason(index.package_rel(read.path)) is None, read.path
    assert off_path_reason("benchmark/one_batch.py") and off_path_reason("multimodal_gen/runtime/x.py")
    assert off_path_reason("api/v1/api_types.py") and off_path_reason("bench_serving.py")
    assert off_path_reason("srt/layers/attention/triton_backend.py") is None


def test_a_deprecated_alias_is_evaluated_with_its_trial_value_not_the_running_one(trees) -> None:  # type: ignore[no-untyped-def]
    """`if cfg.enable_flashinfer_allreduce_fusion and cfg.flashinfer_allreduce_fusion_backend is None`
    (serving_hook.py:286) is about the alias under research: on, not the server's False."""
    index = load_index(trees["0.5.23"])
    verdict = analyze_flag(index, "--enable-flashinfer-allreduce-fusion", profile_facts("h100-qwen3moe"))
    hook = next(f for f in verdict.findings if "serving_hook.py" in f.location)
    assert not any("server.enable_flashinfer_allreduce_fusion" in c["fact"] for c in hook.conditions)


def test_evidence_of_applies_is_not_a_backend_this_deployment_does_not_select(trees) -> None:  # type: ignore[no-untyped-def]
    """--kv-cache-dtype is read in every attention backend's __init__; modules such as
    dsa_backend.py are loaded for type checks but built only for `--attention-backend dsa` (by the
    registry, and by the draft backend factory's tables under "dsa": off here): the cited reader
    is one this Mixtral on flashinfer can run, not another backend's."""
    index = load_index(trees["0.5.23"])
    verdict = analyze_flag(index, "--kv-cache-dtype", profile_facts("a100-mixtral"), value="fp8_e4m3")
    assert verdict.verdict == "applies", verdict.summary
    dsa = [f for f in verdict.findings if "dsa_backend.py" in f.location]
    assert dsa and all(f.alternative and f.state == "off" for f in dsa), [(f.location, f.why) for f in dsa]
    others = [f for f in verdict.findings if f.state != "off" and f.alternative]
    assert not any(f.location in verdict.summary for f in others), verdict.summary


def test_a_flag_the_server_turns_on_itself_is_a_no_op_only_where_it_does(trees) -> None:  # type: ignore[no-untyped-def]
    """0.5.9 enables FlashInfer all-reduce fusion by itself for Qwen3MoE on SM90 (server_args.py:
    1680-1697), not for Llama and not on an H20: only the first is a no-op for that reason. Llama is
    a no-op for another: it builds no LayerCommunicator, the fusion's only user (communicator.py)."""
    index = load_index(trees["0.5.9"])
    flag = "--enable-flashinfer-allreduce-fusion"
    moe = analyze_flag(index, flag, profile_facts("h100-qwen3moe"))
    assert moe.verdict == "no-op" and "server_args.py:1697" in moe.summary, moe.summary
    dense = analyze_flag(index, flag, profile_facts("h100-llama"))
    h20 = analyze_flag(index, flag, {**profile_facts("h100-qwen3moe"), "gpu.name": "NVIDIA H20"})
    for verdict in (dense, h20):
        assert "set anyway" not in verdict.summary and "server_args.py:1697" not in verdict.summary, (
            verdict.summary
        )
    assert h20.verdict != "no-op", h20.summary
    assert dense.verdict == "no-op" and "LayerCommunicator is not built here" in dense.summary, dense.summary


def test_evidence_of_applies_is_a_function_not_a_module_level_table(trees) -> None:  # type: ignore[no-untyped-def]
    """0.5.23 lists --enable-torch-compile in a module-level feature table (kernel_plugins/nvidia/
    binding.py:277, a lambda per flag); the cited reader is code that runs with it."""
    index = load_index(trees["0.5.23"])
    verdict = analyze_flag(index, "--enable-torch-compile", profile_facts("h100-llama"))
    assert verdict.verdict == "applies", verdict.summary
    assert any(f.function == "<module>" and f.state == "on" for f in verdict.findings)
    assert "<module>" not in verdict.summary and "cuda_graph_runner.py" in verdict.summary, verdict.summary


def test_a_size_the_server_picks_from_gpu_memory_is_a_no_op_only_where_it_picks_it(trees) -> None:  # type: ignore[no-untyped-def]
    """0.5.9 picks chunked_prefill_size from the GPU's memory (_handle_gpu_memory_settings,
    server_args.py:935-991: 8192 from 60 to 160 GiB, 4096 below, 16384 above): --chunked-prefill-size
    8192 is a no-op on an 80 GiB H100 and a 141 GiB H200, not on a 46 GiB L40S nor a 179 GiB B200."""
    index = load_index(trees["0.5.9"])
    facts = profile_facts("h100-llama")

    def verdict(mib: int) -> Any:
        return analyze_flag(index, "--chunked-prefill-size", {**facts, "gpu.memory_mib": mib}, value="8192")

    for mib, line in ((81559, 970), (143771, 980)):
        v = verdict(mib)
        assert v.verdict == "no-op" and f"server_args.py:{line}" in v.summary, (mib, v.summary)
    for mib in (46068, 183359):
        v = verdict(mib)
        assert v.verdict == "applies" and "set anyway" not in v.summary, (mib, v.summary)


def test_a_check_for_another_device_does_not_refuse_on_an_nvidia_gpu(trees) -> None:  # type: ignore[no-untyped-def]
    """0.5.23 refuses quantized weights on Apple MPS only (server_args.py:282 'if cfg.device ==
    "mps"' before validate_mps_model_config): a GPU with an SM version resolves the device to cuda."""
    index = load_index(trees["0.5.23"])
    verdict = analyze_flag(index, "--quantization", profile_facts("a100-mixtral"), value="fp8")
    assert "MPS" not in verdict.summary and verdict.verdict == "applies", verdict.summary


def test_a_class_many_functions_name_is_known_unbuilt_where_none_of_them_builds_it(trees) -> None:  # type: ignore[no-untyped-def]
    """0.5.9's FusedMoE is named by 66 functions (MoE blocks of model files, quantization configs'
    `isinstance` checks, the EP layer's class picker; `callers.MAX_SITES`): on a dense Llama none
    of them builds it, on Mixtral its MoE block does."""
    index = load_index(trees["0.5.9"])
    init = index.func("sglang/srt/layers/moe/fused_moe_triton/layer.py", "FusedMoE.__init__")
    gate = caller_gate(index, init, profile_facts("h100-llama"), {})
    assert gate is not None and "not used by LlamaForCausalLM" in gate.message, gate
    assert caller_gate(index, init, profile_facts("a100-mixtral"), {}) is None
