"""Flag catalog, and the index's reads and guards, on real SGLang 0.5.23 and 0.5.9 (the verdicts
on the same flags: tests/test_research_story.py and tests/test_agent_research.py)."""

from __future__ import annotations

from tools.research.flags import analyze_flag, find_flag, flag_catalog, load_index


def test_both_catalogs_have_hundreds_of_typed_flags(sglang_0523, sglang_059):
    for tree in (sglang_0523, sglang_059):
        catalog = flag_catalog(tree)
        assert len(catalog) > 300
        assert len({f.name for f in catalog}) == len(catalog)
        assert sum(f.type is not None for f in catalog) > 0.95 * len(catalog)
        host, port = find_flag(catalog, "--host"), find_flag(catalog, "port")
        assert (host.default, host.type) == ("127.0.0.1", "str")
        assert (port.default, port.type) == (30000, "int")
        dtype = find_flag(catalog, "dtype")
        assert {"auto", "bfloat16", "float16"} <= set(dtype.choices)
        tp = find_flag(catalog, "--tp-size")
        assert tp.dest == "tp_size" and tp.default == 1
        for f in catalog:
            line = (tree.root / f.path).read_text().split("\n")[f.line - 1]
            assert f.dest in line or f.name in line or "add_argument" in line


def test_eras_declare_flags_differently(sglang_0523, sglang_059):
    new = find_flag(flag_catalog(sglang_0523), "enable-fused-moe-sum-all-reduce")
    assert new.path == "sglang/srt/arg_groups/fields/exec_.py"
    assert (new.type, new.default, new.namespace) == ("bool", False, "exec.moe")
    assert find_flag(flag_catalog(sglang_059), "enable-fused-moe-sum-all-reduce") is None
    old = find_flag(flag_catalog(sglang_059), "--moe-runner-backend")
    assert old.path == "sglang/srt/server_args.py"
    assert old.default == "auto" and "triton" in old.choices


def test_fused_moe_read_is_gated_by_topk(sglang_0523):
    assert find_flag(flag_catalog(sglang_0523), "--enable-fused-moe-sum-all-reduce").line == 832
    reads = load_index(sglang_0523).reads("enable_fused_moe_sum_all_reduce")
    [fused] = [r for r in reads if r.path.endswith("moe_runner/triton_utils/fused_moe.py")]
    assert fused.cond.startswith("get_exec().moe.enable_fused_moe_sum_all_reduce and")
    assert "(topk > 2)" in fused.cond
    assert "(not use_int8_w8a16)" in fused.cond and "(not defer_sum)" in fused.cond
    assert fused.effect == "assigned to use_fused_moe_sum_all_reduce"


def test_allreduce_fusion_deprecated_in_0523_only(sglang_0523, sglang_059):
    new = find_flag(flag_catalog(sglang_0523), "enable_flashinfer_allreduce_fusion")
    assert new.deprecated and new.replacement == "--flashinfer-allreduce-fusion-backend=auto"
    # No runtime reader of its own: it is researched through the replacement, not called dead.
    v = analyze_flag(load_index(sglang_0523), "enable_flashinfer_allreduce_fusion", {})
    assert v.researched_as == "--flashinfer-allreduce-fusion-backend=auto" and v.verdict != "dead"

    old = find_flag(flag_catalog(sglang_059), "--enable-flashinfer-allreduce-fusion")
    assert not old.deprecated and old.replacement is None
    reads = load_index(sglang_059).reads("enable_flashinfer_allreduce_fusion")
    runtime = [r for r in reads if not r.path.endswith("server_args.py")]
    assert [r.path for r in runtime] == ["sglang/srt/layers/communicator.py"]
    assert runtime[0].cond.startswith("(_is_sm90_supported or _is_sm100_supported) and")


def test_a_value_forwarded_by_resolution_code_is_live(sglang_0523):
    # 0.5.23 only hands it to the CUDA-graph config (`_set(Phase.DECODE, "max_bs", cfg.x)`);
    # the runtime reads that config, so the flag matters even with no direct runtime reader.
    v = analyze_flag(load_index(sglang_0523), "cuda-graph-max-bs-decode", {})
    assert v.verdict == "applies", v.summary
    assert "sglang/srt/arg_groups/cuda_graph_hook.py:72" in [f.location for f in v.findings]
