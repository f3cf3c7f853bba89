"""Code search over real SGLang: ripgrep and the pure-Python fallback agree, results are bounded."""

from __future__ import annotations

import pytest

from tools.research.search import SearchError, grep, list_files, read_range, rg_binary

CASES = [
    (r"\benable_fused_moe_sum_all_reduce\b", {}),
    (r"topk > 2", {"glob": "*.py"}),
    (r"get_exec\(\)\.moe\.\w+", {}),
    (r"def forward", {"max_results": 150}),
    (r"import torch", {"glob": "sglang/srt/layers/moe/**/*.py"}),
    (r"flashinfer", {"glob": "fused_moe*.py", "ignore_case": True}),
    (r"server_args.x(", {"fixed": True}),
    (r"class \w+Config\(", {"glob": "sglang/srt/configs/*.py"}),
]


def test_ripgrep_is_installed():
    assert rg_binary() is not None  # the `ripgrep` PyPI package is a dependency


@pytest.mark.parametrize(("pattern", "options"), CASES)
def test_rg_and_python_give_identical_results(sglang_0523, pattern, options):
    rg = grep(sglang_0523, pattern, engine="rg", **options)
    py = grep(sglang_0523, pattern, engine="python", **options)
    assert (rg.engine, py.engine) == ("rg", "python")
    assert rg.matches == py.matches
    assert rg.truncated == py.truncated


def test_matches_are_path_line_citations_in_order(sglang_0523):
    result = grep(sglang_0523, r"use_fused_moe_sum_all_reduce\b")
    assert result.matches and not result.truncated
    for m in result.matches:
        line = (sglang_0523.root / m.path).read_text().split("\n")[m.line - 1]
        assert line == m.text
        assert "use_fused_moe_sum_all_reduce" in line
    keys = [(m.path.split("/"), m.line) for m in result.matches]
    assert keys == sorted(keys)
    assert str(result.matches[0]).startswith(f"{result.matches[0].path}:{result.matches[0].line}: ")


def test_results_are_bounded_and_say_so(sglang_0523):
    full = grep(sglang_0523, r"def forward", max_results=100_000)
    cut = grep(sglang_0523, r"def forward", max_results=10)
    assert len(full.matches) > 10 and not full.truncated
    assert cut.truncated and cut.matches == full.matches[:10]


def test_read_range_list_files_and_errors(sglang_0523):
    text = read_range(sglang_0523, "sglang/srt/arg_groups/fields/exec_.py", 832, 835)
    lines = text.split("\n")
    assert len(lines) == 4
    assert lines[0].startswith("832  ") and "enable_fused_moe_sum_all_reduce" in lines[0]
    assert lines[3].startswith("835  ")
    files = list_files(sglang_0523, "sglang/srt/arg_groups/fields/*.py")
    assert "sglang/srt/arg_groups/fields/exec_.py" in files and len(files) == 13
    with pytest.raises(SearchError, match="no such file"):
        read_range(sglang_0523, "../../etc/passwd", 1, 2)
    with pytest.raises(SearchError, match="bad pattern"):
        grep(sglang_0523, "foo(")
    with pytest.raises(SearchError, match="bad range"):
        read_range(sglang_0523, "sglang/srt/server_args.py", 5, 2)
