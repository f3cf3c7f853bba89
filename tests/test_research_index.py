"""The on-disk flag index and the code verdicts on a small SGLang-shaped tree written here: call edges
to a `raise` across modules, dispatch by registry and model architecture, the serving path, same-named
attributes, deprecated flags, `--no-X`, and the index cache (built once, reopened from disk)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tools.research.index as flag_index
from tests.fixtures.sglang_src import synthetic_tree
from tools.research.analysis import analyze_flag
from tools.research.index import index_path, load_index

FILES = {
    "srt/server_args.py": """
        import argparse
        import logging
        from dataclasses import dataclass

        from sglang.srt.utils import is_sm100_supported

        logger = logging.getLogger(__name__)

        @dataclass
        class ServerArgs:
            enable_baz: bool = False
            enable_foo: bool = False
            foo_backend: str = None
            enable_bar: bool = False
            dead_knob: int = 1
            attention_backend: str = "triton"

            def __post_init__(self):
                if self.enable_baz and not is_sm100_supported():
                    logger.warning("baz needs SM100; turning it off")
                    self.enable_baz = False

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--enable-baz", action="store_true", help="Baz.")
                parser.add_argument("--enable-foo", action="store_true", help="Foo.")
                parser.add_argument("--foo-backend", choices=["auto", "fast"], default=ServerArgs.foo_backend)
                parser.add_argument("--enable-bar", action=argparse.BooleanOptionalAction, help="Bar.")
                parser.add_argument("--dead-knob", type=int, default=ServerArgs.dead_knob)
                parser.add_argument("--attention-backend", default=ServerArgs.attention_backend)
                parser.add_argument("--old-foo", action="store_true", help="(Deprecated: use --foo-backend=fast) Old.")
        """,
    "srt/utils.py": """
        def is_sm90_supported():
            return True
        """,
    "srt/layers/foo_check.py": """
        from sglang.srt.utils import is_sm90_supported

        _is_sm90 = is_sm90_supported()

        def check_backend(backend):
            if backend == "fast" and not _is_sm90:
                raise ValueError("the fast foo backend needs SM90")
            return backend
        """,
    "srt/layers/foo.py": """
        from sglang.srt.layers.foo_check import _is_sm90, check_backend

        def resolve(server_args):
            backend = server_args.foo_backend
            if backend is None:
                return None
            return check_backend(backend)

        def use_baz(server_args):
            if server_args.enable_baz:
                return 2
            return 0

        def use_foo(server_args):
            if server_args.enable_foo and _is_sm90:
                return 1
            return 0
        """,
    "srt/entrypoints/protocol.py": """
        class ChatRequest:
            enable_foo: bool = False

        def wants_foo(req):
            return req.enable_foo
        """,
    "srt/layers/attention/attention_registry.py": """
        def register_attention_backend(name):
            return lambda fn: fn

        @register_attention_backend("triton")
        def create_triton(runner):
            from sglang.srt.layers.attention.triton_backend import TritonBackend
            return TritonBackend(runner)

        @register_attention_backend("other")
        def create_other(runner):
            from sglang.srt.layers.attention.other_backend import OtherBackend
            return OtherBackend(runner)
        """,
    "srt/layers/attention/triton_backend.py": "class TritonBackend:\n    pass\n",
    "srt/layers/attention/other_backend.py": """
        class OtherBackend:
            def __init__(self, runner):
                self.bar = runner.server_args.enable_bar
                if runner.server_args.enable_bar:
                    self.mode = 2
        """,
    "srt/models/alpha.py": """
        class AlphaForCausalLM:
            def __init__(self, server_args):
                self.knob = server_args.dead_knob
                if self.knob:
                    self.x = 1
        """,
    "srt/models/beta.py": "class BetaForCausalLM:\n    pass\n",
    "benchmark/one_batch.py": "def run(server_args):\n    if server_args.dead_knob > 1:\n        return 2\n",
}


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.9")


def _facts(sm: int, **server: object) -> dict[str, object]:
    facts: dict[str, object] = {"gpu.sm": sm, "model.architecture": "BetaForCausalLM"}
    facts.update({f"server.{k}": v for k, v in server.items()})
    return facts


def test_a_raise_in_another_module_is_a_start_up_refusal(tree) -> None:  # type: ignore[no-untyped-def]
    index = load_index(tree)
    v = analyze_flag(index, "--foo-backend", _facts(120), value="fast")
    assert v.verdict == "refuses-to-start", v.summary
    assert "the fast foo backend needs SM90" in v.summary and "foo_check.py:8" in v.summary
    assert analyze_flag(index, "--foo-backend", _facts(90), value="fast").verdict == "applies"
    # with "auto" the raise's own guard (`backend == "fast"`) is false: nothing refuses
    assert analyze_flag(index, "--foo-backend", _facts(120), value="auto").verdict == "applies"
    # a deprecated flag is researched through its replacement's readers
    old = analyze_flag(index, "--old-foo", _facts(120))
    assert old.verdict == "refuses-to-start" and old.researched_as == "--foo-backend=fast"


def test_a_fallback_that_switches_the_flag_off_is_a_noop(tree) -> None:  # type: ignore[no-untyped-def]
    index = load_index(tree)
    off = analyze_flag(index, "--enable-baz", _facts(90))
    assert off.verdict == "no-op" and "baz needs SM100; turning it off" in off.summary
    assert "server_args.py:" in off.summary
    assert analyze_flag(index, "--enable-baz", _facts(100)).verdict == "applies"


def test_guard_on_a_platform_constant_makes_a_noop(tree) -> None:  # type: ignore[no-untyped-def]
    index = load_index(tree)
    v = analyze_flag(index, "enable_foo", _facts(120))
    assert v.verdict == "no-op" and "_is_sm90" in v.summary
    assert analyze_flag(index, "enable-foo", _facts(90)).verdict == "applies"
    # the request model's own `enable_foo` field is not the flag
    assert not any("protocol.py" in f.location for f in v.findings)
    assert any("protocol.py:6" in n and "another object" in n for n in v.notes)


def test_dispatch_by_registry_and_model_and_the_serving_path(tree) -> None:  # type: ignore[no-untyped-def]
    index = load_index(tree)
    triton = analyze_flag(index, "--enable-bar", _facts(90, attention_backend="triton"))
    assert triton.verdict == "no-op" and "other_backend" in triton.summary
    other = analyze_flag(index, "--enable-bar", _facts(90, attention_backend="other"))
    assert other.verdict == "applies"
    assert analyze_flag(index, "--no-enable-bar", _facts(90, attention_backend="other")).value is False
    # left to SGLang (None: chosen at start-up), the backend is not known, so neither is the reader
    auto = analyze_flag(index, "--enable-bar", _facts(90, attention_backend=None))
    assert auto.verdict != "no-op" and auto.certainty <= 0.6, (auto.verdict, auto.certainty, auto.summary)
    # dead_knob: read by another model's file and by a benchmark; neither runs for BetaForCausalLM
    knob = analyze_flag(index, "--dead-knob", _facts(90), value="2")
    assert knob.verdict == "no-op" and "not used by BetaForCausalLM" in knob.summary
    assert not any("benchmark" in f.location for f in knob.findings)
    alpha = {**_facts(90), "model.architecture": "AlphaForCausalLM"}
    assert analyze_flag(index, "--dead-knob", alpha, value="2").verdict == "applies"
    assert analyze_flag(index, "--no-such-knob", _facts(90)).verdict == "incompatible-with-version"


def test_the_index_is_built_once_and_reopened_from_disk(tree, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    first = load_index(tree)
    path = index_path(tree)
    assert path.is_file() and path.name.startswith("9.9.9-") and first.version == "9.9.9"
    built = path.stat().st_mtime_ns
    monkeypatch.setattr(flag_index, "_LOADED", {})

    def no_build(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the index was rebuilt")

    monkeypatch.setattr(flag_index, "build_index", no_build)
    again = load_index(tree)
    assert again is not first and path.stat().st_mtime_ns == built
    assert [r.line for r in again.reads("foo_backend")] == [r.line for r in first.reads("foo_backend")]


def test_a_multi_threaded_caller_builds_in_a_fresh_interpreter(tree, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import threading

    calls = []
    real_run = subprocess.run

    def run(argv, **kw):  # type: ignore[no-untyped-def]
        calls.append(argv)
        return real_run(argv, **kw)

    monkeypatch.setattr(flag_index.subprocess, "run", run)
    release = threading.Event()
    waiter = threading.Thread(target=release.wait)
    waiter.start()
    try:
        index = flag_index.build_index(tree, tmp_path / "threaded.sqlite")
    finally:
        release.set()
        waiter.join()
    assert calls and calls[0][1:3] == ["-m", "tools.research.index"]
    assert [r.line for r in index.reads("enable_baz")] == [
        r.line for r in load_index(tree).reads("enable_baz")
    ]


def test_two_trees_of_one_version_keep_their_own_indexes(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    first = synthetic_tree(tmp_path / "a", monkeypatch, FILES, "9.9.9")
    monkeypatch.setenv("OPTAGENT_CACHE_DIR", str(tmp_path / "cache"))
    second = synthetic_tree(tmp_path / "b", monkeypatch, FILES, "9.9.9")
    monkeypatch.setenv("OPTAGENT_CACHE_DIR", str(tmp_path / "cache"))
    load_index(first)
    load_index(second)
    assert index_path(first) != index_path(second)
    assert index_path(first).is_file() and index_path(second).is_file()  # neither evicted the other
    # a rebuild of one tree (its source changed) replaces that tree's older index only
    stale = index_path(first)
    args = first.package_dir / "srt" / "server_args.py"
    args.write_text(args.read_text() + "\n")
    monkeypatch.setattr(flag_index, "_LOADED", {})
    load_index(first)
    assert index_path(first) != stale and index_path(first).is_file()
    assert not stale.exists()
    assert index_path(second).is_file()


def test_a_file_over_the_size_limit_is_skipped_with_a_note(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    files = {**FILES, "srt/layers/table.py": "X = 1\n"}
    big = synthetic_tree(tmp_path, monkeypatch, files, "9.9.9")
    table = big.package_dir / "srt" / "layers" / "table.py"
    table.write_text("def use(server_args):\n    return server_args.enable_foo\n" + "# pad\n" * 1_000_000)
    assert table.stat().st_size > flag_index.MAX_FILE_BYTES
    index = load_index(big)
    assert index.skipped == ["sglang/srt/layers/table.py (6 MB)"]
    assert not any(r.path.endswith("table.py") for r in index.reads("enable_foo"))
    verdict = analyze_flag(index, "--enable-foo", _facts(90))
    assert any("not read, over 4 MB: sglang/srt/layers/table.py" in n for n in verdict.notes)


def test_flashinfer_is_installed_where_the_versions_server_requirements_say_so(
    sglang_049, sglang_0523
) -> None:  # type: ignore[no-untyped-def]
    """0.4.9 requires flashinfer_python for its `srt` extra (every server installs it), 0.5.23 for
    every install: on an NVIDIA GPU `software.flashinfer` is a fact, not a missing one."""
    from tools.research.facts import installed

    for tree in (sglang_049, sglang_0523):
        index = load_index(tree)
        assert "flashinfer_python" in index.requires, sorted(index.requires)[:20]
        assert installed(index, {"gpu.sm": 90})["software.flashinfer"] is True
        assert installed(index, {"gpu.vendor": "amd"}) == {}


def test_module_status_is_cached_on_disk_under_one_key_whatever_the_hash_seed(tree) -> None:  # type: ignore[no-untyped-def]
    """A warm CLI call skips the module walk only if every process finds the same status file:
    the key must not follow the per-process order of a set (`PYTHONHASHSEED`)."""
    import os
    import subprocess
    import sys

    index = load_index(tree)
    child = (
        "import sys; from pathlib import Path; from tools.research.index import load_index;"
        "from tools.research.source import local_source; from tools.research.analysis import analyze_flag;"
        f"t = local_source(Path({str(tree.root)!r}), version='9.9.9');"
        "analyze_flag(load_index(t), '--enable-bar', {'gpu.sm': 90, 'model.architecture': 'BetaForCausalLM',"
        " 'server.attention_backend': 'other', 'model.attention_kinds': frozenset({'full', 'linear', 'swa'})})"
    )
    root = Path(__file__).resolve().parent.parent
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}
        subprocess.run([sys.executable, "-c", child], env=env, check=True, cwd=root)
    assert len(list(index.db.parent.glob(index.db.stem + ".status-*.json"))) == 1


def test_a_status_file_is_read_as_data_so_a_planted_pickle_runs_nothing(tree, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The cache keeps every module's status per deployment next to the index; the main process
    reads it back as JSON, so a file planted there (a pickle that runs code when loaded) runs
    nothing and the status is computed again."""
    import pickle

    import tools.research.dispatch as dispatch

    index = load_index(tree)
    first = dispatch.module_status(index, _facts(90))
    files = list(index.db.parent.glob(index.db.stem + ".status-*"))
    assert [f.suffix for f in files] == [".json"]
    canary = tmp_path / "canary"

    class Planted:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (Path.write_text, (canary, "ran"))  # what pickle.load would call

    files[0].write_bytes(pickle.dumps(Planted()))
    dispatch._STATUS_CACHE.clear()
    dispatch._LAST.clear()
    assert dispatch.module_status(index, _facts(90)) == first
    assert not canary.exists()
    assert json.loads(files[0].read_text()) == first  # written again, as data
