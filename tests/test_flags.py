"""Flag catalog, readers, guards and dead-flag verdicts on real SGLang 0.5.23 and 0.5.9."""

from __future__ import annotations

from tools.research.flags import find_flag, flag_catalog, research_flag


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


def test_fused_moe_reader_is_gated_by_topk(sglang_0523):
    report = research_flag(sglang_0523, "--enable-fused-moe-sum-all-reduce")
    assert report.flag.line == 832 and not report.dead
    fused = [r for r in report.readers if r.path.endswith("moe_runner/triton_utils/fused_moe.py")]
    assert len(fused) == 1
    reader = fused[0]
    assert "get_exec().moe.enable_fused_moe_sum_all_reduce" in reader.text
    assert "topk > 2" in reader.guards
    assert "not use_int8_w8a16" in reader.guards and "not defer_sum" in reader.guards
    assert reader.effect.startswith("assigned to use_fused_moe_sum_all_reduce")


def test_allreduce_fusion_deprecated_in_0523_only(sglang_0523, sglang_059):
    new = research_flag(sglang_0523, "enable_flashinfer_allreduce_fusion")
    assert new.flag.deprecated
    assert new.flag.replacement == "--flashinfer-allreduce-fusion-backend=auto"
    # No runtime reader, but resolution turns it into the replacement: not dead.
    assert not new.dead
    assert all(r.kind == "config" for r in new.readers)
    assert any("flashinfer_allreduce_fusion_backend" in n for n in new.notes)

    old = research_flag(sglang_059, "--enable-flashinfer-allreduce-fusion")
    assert not old.flag.deprecated and old.flag.replacement is None
    runtime = [r for r in old.readers if r.kind == "use"]
    assert [r.path for r in runtime] == ["sglang/srt/layers/communicator.py"]
    assert "(_is_sm90_supported or _is_sm100_supported)" in runtime[0].guards


def test_dead_and_narrow_flags(sglang_0523, sglang_059):
    for tree in (sglang_0523, sglang_059):
        steps = research_flag(tree, "num-continuous-decode-steps")
        assert steps.flag is not None and steps.dead
        assert not [r for r in steps.readers if r.kind == "use"]
    assert research_flag(sglang_0523, "triton-attention-reduce-in-fp32").dead
    fp32 = research_flag(sglang_059, "triton-attention-reduce-in-fp32")
    assert not fp32.dead
    assert {r.path.rsplit("/", 1)[-1] for r in fp32.readers} == {
        "double_sparsity_backend.py",
        "double_sparsity_attention.py",
    }


def test_unknown_flag_is_reported_not_raised(sglang_059):
    report = research_flag(sglang_059, "--no-such-flag-anywhere")
    assert report.flag is None and not report.dead and report.readers == []
    assert "not a launch_server flag" in report.notes[0]


def test_a_value_forwarded_by_resolution_code_is_live(sglang_0523):
    # 0.5.23 only hands it to the CUDA-graph config (`_set(Phase.DECODE, "max_bs", cfg.x)`);
    # the runtime reads that config, so the flag matters even with no direct runtime reader.
    report = research_flag(sglang_0523, "cuda-graph-max-bs-decode")
    assert not report.dead
    forwarded = [r for r in report.readers if (r.effect or "").startswith("passed to _set")]
    assert forwarded and forwarded[0].path.endswith("arg_groups/cuda_graph_hook.py")
