"""The index's guards and effects on a small written tree; `--help` parsing; the host catalog; the CLI."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tools.research.index as flag_index
from agent.cli.main import app
from tools.deploy.remote import LocalTransport
from tools.research.flags import (
    analyze_flag,
    catalog_from_host,
    find_flag,
    flag_catalog,
    load_index,
    parse_help_text,
)
from tools.research.source import local_source

SERVER_ARGS = """
import argparse, dataclasses

@dataclasses.dataclass
class ServerArgs:
    foo_mode: str = "fast"
    unused_knob: int = 3
    logged_only: bool = False

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--foo-mode", type=str, default=ServerArgs.foo_mode, choices=["fast", "slow"],
                            help="How to foo.")
        parser.add_argument("--unused-knob", type=int, default=ServerArgs.unused_knob, help="Nothing.")
        parser.add_argument("--logged-only", action="store_true", help="Only logged.")
"""

RUNTIME = """
import logging
logger = logging.getLogger(__name__)

def run(server_args, topk, sm):
    if sm >= 90:
        if server_args.foo_mode == "fast" and topk > 2:
            return 1
    else:
        x = 0
    use = topk > 4 or server_args["foo_mode"] == "slow"
    value = getattr(server_args, "foo_mode", None) if use else None
    unused = server_args.unused_knob
    logger.info("logged %s", server_args.logged_only)
    return value
"""


def _tree(tmp_path: Path):
    pkg = tmp_path / "sglang"
    (pkg / "srt" / "layers").mkdir(parents=True)
    (pkg / "srt" / "server_args.py").write_text(textwrap.dedent(SERVER_ARGS))
    (pkg / "srt" / "layers" / "foo.py").write_text(textwrap.dedent(RUNTIME))
    return local_source(tmp_path, version="9.9.9")


def _index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tree):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OPTAGENT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(flag_index, "_LOADED", {})
    return load_index(tree)


def test_a_read_keeps_its_enclosing_guards_and_the_condition_it_sits_in(tmp_path, monkeypatch):
    index = _index(tmp_path, monkeypatch, _tree(tmp_path))
    reads = {r.line: r for r in index.reads("foo_mode")}
    # The `default=ServerArgs.foo_mode` inside add_argument is a definition, not a read.
    assert set(reads) == {7, 11, 12} and {r.path for r in reads.values()} == {"sglang/srt/layers/foo.py"}
    assert reads[7].guards == ["sm >= 90"] and reads[7].func == "run"
    assert reads[7].cond == "server_args.foo_mode == 'fast' and topk > 2"
    assert reads[11].cond == "topk > 4 or server_args['foo_mode'] == 'slow'"
    assert reads[11].effect == "assigned to use"
    assert "use" in reads[12].guards


def test_dead_when_unused_or_only_logged(tmp_path, monkeypatch):
    tree = _tree(tmp_path)
    index = _index(tmp_path, monkeypatch, tree)
    unused = analyze_flag(index, "--unused-knob", {})
    assert unused.verdict == "dead" and unused.findings[0].why == "assigned to unused, never used"
    logged = analyze_flag(index, "logged-only", {})
    assert logged.verdict == "dead" and logged.findings[0].why == "only logged"
    assert "read only where nothing follows" in logged.summary
    assert analyze_flag(index, "foo_mode", {}).verdict != "dead"
    live = find_flag(flag_catalog(tree), "foo_mode")
    assert live.choices == ["fast", "slow"] and live.default == "fast"


def test_readers_in_test_code_do_not_make_a_flag_live(tmp_path, monkeypatch):
    tree = _tree(tmp_path)
    pkg = tmp_path / "sglang"
    reader = "def check(server_args):\n    if server_args.unused_knob > 2:\n        return 1\n"
    for rel in (
        "test/srt/runner.py",
        "srt/tests/helper.py",
        "srt/test_knob.py",
        "srt/knob_test.py",
        "conftest.py",
    ):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(reader)
    (pkg / "srt" / "testing_utils.py").write_text(reader.replace("check", "check_real"))
    index = _index(tmp_path, monkeypatch, tree)
    paths = {r.path for r in index.reads("unused_knob")}
    assert paths == {"sglang/srt/layers/foo.py", "sglang/srt/testing_utils.py"}  # test code is left out
    (pkg / "srt" / "testing_utils.py").unlink()
    index = _index(tmp_path / "again", monkeypatch, tree)
    report = analyze_flag(index, "--unused-knob", {})
    assert report.verdict == "dead" and [f.location for f in report.findings] == [
        "sglang/srt/layers/foo.py:13"
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch_server")
    parser.add_argument("--model-path", "--model", type=str, required=True, help="The model weights.")
    parser.add_argument("--dtype", choices=["auto", "half", "bfloat16"], default="auto", help="Data type.")
    parser.add_argument(
        "--enable-fused-moe-sum-all-reduce", action="store_true", help="Enable fused moe triton and sum " * 4
    )
    parser.add_argument("--cuda-graph-bs", type=int, nargs="+", help="Batch sizes.")
    parser.add_argument(
        "--enable-flashinfer-allreduce-fusion",
        action="store_true",
        help="(Deprecated: use --flashinfer-allreduce-fusion-backend=auto) Enable FlashInfer fusion.",
    )
    parser.add_argument("--enable-tf32-matmul", action=argparse.BooleanOptionalAction, help="TF32.")
    return parser


def test_parse_help_text_of_a_real_argparse_parser():
    flags = {f.name: f for f in parse_help_text(_parser().format_help())}
    assert list(flags) == [
        "--model-path",
        "--dtype",
        "--enable-fused-moe-sum-all-reduce",
        "--cuda-graph-bs",
        "--enable-flashinfer-allreduce-fusion",
        "--enable-tf32-matmul",
    ]
    assert flags["--model-path"].aliases == ["--model"] and flags["--model-path"].type == "str"
    assert flags["--dtype"].choices == ["auto", "half", "bfloat16"]
    fused = flags["--enable-fused-moe-sum-all-reduce"]
    assert fused.type == "bool" and fused.help.count("Enable fused moe") == 4  # wrapped lines joined
    assert flags["--cuda-graph-bs"].type == "list"
    fusion = flags["--enable-flashinfer-allreduce-fusion"]
    assert fusion.deprecated and fusion.replacement == "--flashinfer-allreduce-fusion-backend=auto"
    assert flags["--enable-tf32-matmul"].aliases == ["--no-enable-tf32-matmul"]


def test_catalog_from_the_host_runs_launch_server_help(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    source = Path(__file__).read_text()
    start, end = source.index("def _parser()"), source.index("def test_parse_help_text")
    (pkg / "launch_server.py").write_text(
        "import argparse\n" + source[start:end] + "\n_parser().parse_args()\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    flags = asyncio.run(catalog_from_host(LocalTransport(), sys.executable))
    assert [f.name for f in flags][:2] == ["--model-path", "--dtype"]
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "nothing"))
    with pytest.raises(RuntimeError, match="No module named 'sglang'"):
        asyncio.run(catalog_from_host(LocalTransport(), sys.executable))


def test_cli_flags_and_research(sglang_0523, tmp_path):
    runner = CliRunner()
    out = runner.invoke(
        app, ["flags", "--source", str(sglang_0523.root), "--grep", "fused-moe-sum", "--json"]
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["version"] == "0.5.23"
    assert [f["name"] for f in data["flags"]] == ["--enable-fused-moe-sum-all-reduce"]

    model = Path(__file__).parent / "data" / "model-configs" / "Qwen--Qwen3.5-122B-A10B_config.json"
    args = ["research", "enable_fused_moe_sum_all_reduce", "--source", str(sglang_0523.root)]
    out = runner.invoke(app, [*args, "--model-config", str(model)])
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    assert "sglang/srt/arg_groups/fields/exec_.py:832" in text
    assert "check topk > 2 (here model.experts_per_tok = 8): holds" in text
    assert "verdict: applies (code" in text and "fused_moe.py:635" in text

    # dashes in any position, hardware facts on the command line, the shared vocabulary
    fusion = ["research", "--enable-flashinfer-allreduce-fusion", "--source", str(sglang_0523.root)]
    out = runner.invoke(app, [*fusion, "--gpu-sm", "120", "--gpus", "4", "--tp", "4"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    assert "verdict: refuses-to-start" in text and "flashinfer_comm_fusion.py:49" in text
    out = runner.invoke(app, [*fusion, "--gpu-sm", "90", "--tp", "4", "--json"])
    assert json.loads(out.stdout)["verdict"] == "applies"
    out = runner.invoke(
        app, ["research", "--no-enable-tf32-matmul", "--source", str(sglang_0523.root), "--json"]
    )
    assert out.exit_code == 0 and json.loads(out.stdout)["verdict"] == "no-op"

    out = runner.invoke(app, [*fusion, "--server-arg", "attention_backend"])
    assert out.exit_code == 2 and "KEY=VALUE" in out.output

    out = runner.invoke(app, [*args, "--model-config", str(tmp_path / "missing.json")])
    assert out.exit_code == 2 and "no such file" in out.output


def test_research_of_an_unknown_flag_exits_2_with_close_names(tmp_path, monkeypatch):
    root = _tree(tmp_path).root
    (root / "sglang" / "_version.py").write_text('__version__ = "9.9.9"\n')
    runner = CliRunner()
    monkeypatch.setenv("OPTAGENT_CACHE_DIR", str(tmp_path / "cache"))
    out = runner.invoke(app, ["research", "foo-mod", "--source", str(root)])
    assert out.exit_code == 2, out.output
    assert not (tmp_path / "cache" / "flag-index").exists()  # the catalog answered: no index was built
    text = " ".join(out.output.split())
    assert "--foo-mod is not a launch_server flag of SGLang 9.9.9" in text
    assert "did you mean --foo-mode" in text and "verdict" not in text
    out = runner.invoke(app, ["research", "foo-mod", "--source", str(root), "--json"])
    assert out.exit_code == 2
    data = json.loads(out.stdout)
    assert data["suggestions"] == ["--foo-mode"] and "not a launch_server flag" in data["error"]
    out = runner.invoke(app, ["research", "zzzz-qqqq", "--source", str(root)])
    assert out.exit_code == 2 and "did you mean" not in out.output
    assert runner.invoke(app, ["research", "foo_mode", "--source", str(root)]).exit_code == 0


def test_research_by_version_without_a_simulated_host_set_up(sglang_0523, tmp_path, monkeypatch):
    """No optagent.toml and no `optagent sim up` yet: research still answers from the code (the
    start-up check has no unit file to read and says what it lacks) instead of failing."""
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(app, ["research", "--enable-mixed-chunk", "--version", "0.5.23", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["verdict"] in ("applies", "unknown") and data["version"] == "0.5.23"
    assert any("SGLang's own start-up: not run" in n for n in data["notes"]), data["notes"]
