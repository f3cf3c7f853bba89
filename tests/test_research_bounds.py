"""Research bounded per tree, on small SGLang-shaped trees written here with hostile files added: a
file nested too deeply to walk, files past the tree's budget of bytes, of files or of time, one
file's records past its cap, one setting's reads past theirs, a guard too large to evaluate. Each is
left out with a note that reaches the verdict; the rest of the tree is still read."""

from __future__ import annotations

import textwrap
import time

import pytest

import tools.research.flag_index.write as index_write
import tools.research.index as flag_index
import tools.research.walk.file as walk_file_module
from tests.fixtures.sglang_src import synthetic_tree
from tests.test_research_index import FILES
from tools.research import findings
from tools.research.analysis import analyze_flag
from tools.research.catalog import flag_catalog
from tools.research.flag_index import budget
from tools.research.guard_eval import TOO_LARGE
from tools.research.index import load_index

FACTS = {"gpu.sm": 90, "model.architecture": "BetaForCausalLM"}


def _dense(count: int, tag: str) -> str:
    """Functions that each read `enable_foo` twice, raise and call: ~150 bytes a function."""
    return "".join(
        f"def f_{tag}_{i}(server_args):\n"
        f"    if server_args.enable_foo and server_args.dead_knob > {i}:\n"
        f"        raise ValueError('no {i}')\n"
        f"    return g_{tag}_{i}(server_args.enable_foo)\n\n"
        for i in range(count)
    )


def _padded(i: int, size: int) -> str:
    """A generated-looking file of `size` bytes: one reader of `enable_foo`, then comments."""
    head = f"def table_{i}(server_args):\n    return server_args.enable_foo\n"
    return head + "# pad\n" * ((size - len(head)) // 6)


def _read_paths(index, dest: str = "enable_foo") -> set[str]:  # type: ignore[no-untyped-def]
    return {r.path for r in index.reads(dest)}


@pytest.mark.parametrize(
    "expression",
    [
        " + ".join(["a"] * 1000),  # a 1,000-term sum: 1,000 levels of BinOp
        "not " * 1000 + "a",
        "a" + ".b" * 1000,
        "a" + "()" * 1000,
    ],
    ids=["sum", "not", "attributes", "calls"],
)
def test_a_file_nested_too_deeply_is_left_unread_and_named(tmp_path, monkeypatch, expression) -> None:  # type: ignore[no-untyped-def]
    text = f"def hostile(server_args):\n    a = server_args.enable_foo\n    x = {expression}\n    return x\n"
    assert len(text) < 4200  # a 4 KB file
    # beside it, a 60-term sum: within the limit (real code nests at most 39 levels), read
    edge = (
        "def edge(server_args):\n    if "
        + " + ".join(["server_args.enable_foo"] * 60)
        + ":\n        return 1\n"
    )
    files = {**FILES, "srt/layers/hostile.py": text, "srt/layers/edge.py": edge}
    tree = synthetic_tree(tmp_path, monkeypatch, files, "9.9.9")
    index = load_index(tree)  # two worker processes, as a run builds it
    assert "sglang/srt/layers/edge.py" in _read_paths(index)
    (note,) = index.unread
    assert note == "not read (nested more than 100 levels deep): sglang/srt/layers/hostile.py"
    verdict = analyze_flag(index, "--enable-foo", FACTS)
    assert verdict.verdict == "applies"  # the rest of the tree is read: srt/layers/foo.py's reader
    assert "sglang/srt/layers/foo.py" in {f.location.rsplit(":", 1)[0] for f in verdict.findings}
    assert note in verdict.notes


def test_many_large_files_past_the_trees_bytes_are_left_unread_and_named(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Twelve files of a little over 1 MiB (larger than any real source file): the tree's own files
    are read first, then the large ones smallest first until the bytes are spent; the rest are named."""
    size = budget.TYPICAL_FILE_BYTES + 2**16
    files = {**FILES, **{f"srt/gen/table_{i:02}.py": _padded(i, size + 1000 * (11 - i)) for i in range(12)}}
    tree = synthetic_tree(tmp_path, monkeypatch, files, "9.9.9")
    own = sum((tree.package_dir / rel).stat().st_size for rel in FILES if rel.startswith("srt/"))
    monkeypatch.setattr(budget, "MAX_TREE_BYTES", own + 3 * size + 3 * 2**15)
    start = time.monotonic()
    index = flag_index.build_index(tree, tmp_path / "index.sqlite", workers=1)
    assert time.monotonic() - start < 60
    read = _read_paths(index)
    assert {"sglang/srt/layers/foo.py", "sglang/srt/server_args.py"} <= set(index.modules)
    assert "sglang/srt/layers/foo.py" in read
    assert sorted(p for p in read if "/gen/" in p) == [f"sglang/srt/gen/table_{i:02}.py" for i in (9, 10, 11)]
    assert sum((tree.root / p).stat().st_size for p in index.modules) <= budget.MAX_TREE_BYTES
    unread = ", ".join(f"sglang/srt/gen/table_{i:02}.py" for i in range(8, -1, -1))
    note = f"not read (over the tree's budget of {budget.MAX_TREE_BYTES / 2**20:g} MiB of source): {unread}"
    assert index.unread == [note]
    verdict = analyze_flag(index, "--enable-foo", FACTS)
    assert note in verdict.notes


def test_a_note_names_a_dozen_files_and_counts_the_rest(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    files = {**FILES, **{f"srt/gen/t{i:02}.py": f"X_{i} = {i}\n" for i in range(30)}}
    tree = synthetic_tree(tmp_path, monkeypatch, files, "9.9.9")
    monkeypatch.setattr(budget, "MAX_TREE_FILES", 10)
    index = flag_index.build_index(tree, tmp_path / "index.sqlite", workers=1)
    assert len(index.modules) == 10
    (note,) = index.unread
    # argument code first, then path order: srt/entrypoints/protocol.py, then srt/gen/t00..t07
    head = "not read (over the tree's budget of 10 files): sglang/srt/gen/t08.py, sglang/srt/gen/t09.py, "
    assert note.startswith(head), note
    assert note.endswith(", sglang/srt/gen/t19.py and 18 more"), note


def test_files_not_started_within_the_builds_time_are_left_unread(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tree = synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.9")
    monkeypatch.setattr(flag_index, "MAX_BUILD_SECONDS", 0.0)
    index = flag_index.build_index(tree, tmp_path / "index.sqlite", workers=1)
    (note,) = index.unread
    assert note.startswith("not read (over the build's budget of 0 s): sglang/srt/server_args.py, ")
    assert index.modules == {}
    verdict = analyze_flag(index, "--enable-foo", FACTS)  # the catalog is read apart: still a flag
    assert verdict.verdict == "dead"
    assert note in verdict.notes


def test_a_file_past_its_records_cap_is_left_unread(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    files = {**FILES, "srt/gen/dense.py": _dense(200, "d"), "srt/gen/many.py": _dense(2000, "m")}
    tree = synthetic_tree(tmp_path, monkeypatch, files, "9.9.9")
    monkeypatch.setattr(flag_index, "MAX_FILE_RECORDS", 64 * 2**10)
    index = flag_index.build_index(tree, tmp_path / "index.sqlite", workers=1)
    assert index.unread == [  # many.py, 2,000 functions with 4,000 reads: stopped as it is walked
        "not read (over 0.0625 MiB of records for one file): sglang/srt/gen/dense.py",
        "not read (more than 5,000 functions and reads in one file): sglang/srt/gen/many.py",
    ]
    assert {"sglang/srt/gen/dense.py", "sglang/srt/gen/many.py"}.isdisjoint(_read_paths(index))
    assert "sglang/srt/layers/foo.py" in _read_paths(index)


def test_files_past_the_trees_records_are_left_unread(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    files = {**FILES, **{f"srt/zz/dense_{i}.py": _dense(100, str(i)) for i in range(8)}}
    tree = synthetic_tree(tmp_path, monkeypatch, files, "9.9.9")
    monkeypatch.setattr(flag_index, "MAX_TREE_RECORDS", 200 * 2**10)
    index = flag_index.build_index(tree, tmp_path / "index.sqlite", workers=1)
    read = [i for i in range(8) if f"sglang/srt/zz/dense_{i}.py" in index.modules]
    assert 0 < len(read) < 8 and read == list(range(len(read))), read  # the first ones, in path order
    (note,) = index.unread
    unread = ", ".join(f"sglang/srt/zz/dense_{i}.py" for i in range(len(read), 8))
    assert note == f"not read (over the tree's budget of 0.195312 MiB of records): {unread}"
    assert "sglang/srt/layers/foo.py" in _read_paths(index)


def test_one_settings_reads_past_the_cap_are_cut_with_a_note(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    files = {**FILES, "srt/gen/dense.py": _dense(50, "d")}
    tree = synthetic_tree(tmp_path, monkeypatch, files, "9.9.9")
    monkeypatch.setattr(index_write, "MAX_READS", 20)
    index = flag_index.build_index(tree, tmp_path / "index.sqlite", workers=1)
    reads = index.reads("enable_foo")
    assert len(reads) == 20
    # protocol.py's `req.enable_foo`, 100 in dense.py, foo.py's: the first 20 in read order are kept
    assert index.cut["enable_foo"] == (20, 102)
    assert {r.path for r in reads} == {"sglang/srt/entrypoints/protocol.py", "sglang/srt/gen/dense.py"}
    verdict = analyze_flag(index, "--enable-foo", FACTS)
    assert "only the first 20 of 102 reads of `enable_foo` are indexed (the cap per setting)" in verdict.notes
    assert len(verdict.findings) <= 20


def test_a_guard_too_large_to_evaluate_is_unknown_not_a_hang(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Each local names the one before twelve times: the guard stands for 12**5 terms, in a file well
    within the depth limit. Its evaluation stops at the step budget: the reader is left open."""
    lines = ["def chained(server_args):", "    v0 = server_args.dead_knob"]
    lines += [f"    v{i} = " + " + ".join([f"v{i - 1}"] * 12) for i in range(1, 6)]
    lines += ["    if server_args.enable_foo and v5 > 1:", "        return 1", "    return 0"]
    files = {**FILES, "srt/layers/chained.py": "\n".join(lines) + "\n"}
    tree = synthetic_tree(tmp_path, monkeypatch, files, "9.9.9")
    index = load_index(tree)
    assert index.unread == []
    start = time.monotonic()
    verdict = analyze_flag(index, "--enable-foo", FACTS)
    assert time.monotonic() - start < 60
    (found,) = [f for f in verdict.findings if f.location.startswith("sglang/srt/layers/chained.py")]
    assert found.state == "runtime", found
    assert found.why == f"open: {TOO_LARGE.strip('()')}", found.why


def test_a_read_after_a_thousand_early_returns_keeps_the_first_guards(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Each `if c: return` puts `not c` on what follows: past `MAX_GUARDS` the rest are one runtime
    condition, so records stay small and the reader is left open, never taken as on."""
    lines = ["def picky(server_args):"]
    lines += [f"    if server_args.dead_knob == {i}:\n        return {i}" for i in range(1000)]
    lines += ["    return server_args.enable_foo"]
    files = {**FILES, "srt/layers/picky.py": "\n".join(lines) + "\n"}
    tree = synthetic_tree(tmp_path, monkeypatch, files, "9.9.9")
    index = load_index(tree)
    (read,) = [r for r in index.reads("enable_foo") if r.path.endswith("picky.py")]
    assert len(read.guards) == budget.MAX_GUARDS == 128
    assert (
        read.guards[0] == "not (server_args.dead_knob == 0)" and read.guards[-1] == "__guards_past_the_cap__"
    )
    verdict = analyze_flag(index, "--enable-foo", {**FACTS, "server.dead_knob": 1})
    (found,) = [f for f in verdict.findings if "picky.py" in f.location]
    assert found.state == "off"  # `not dead_knob == 1` fails among the guards kept
    verdict = analyze_flag(index, "--enable-foo", {**FACTS, "server.dead_knob": 5000})
    (found,) = [f for f in verdict.findings if "picky.py" in f.location]
    assert found.state == "runtime"  # all 127 kept hold; the rest stay open


def test_a_file_slower_to_walk_than_its_time_is_left_unread(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A local read anew on each of 3,000 lines: once a walk of the whole function per read (minutes),
    now one per local; and past `MAX_FILE_SECONDS` (here none) a file is left unread."""
    lines = ["def again(server_args):"]
    lines += [f"    x = server_args.enable_foo\n    y{i} = x" for i in range(3000)]
    files = {**FILES, "srt/layers/again.py": "\n".join(lines) + "\n"}
    tree = synthetic_tree(tmp_path, monkeypatch, files, "9.9.9")
    start = time.monotonic()
    index = flag_index.build_index(tree, tmp_path / "index.sqlite", workers=1)
    assert time.monotonic() - start < 60
    assert index.unread == []
    assert len([r for r in index.reads("enable_foo") if r.path.endswith("again.py")]) == 3000
    monkeypatch.setattr(walk_file_module, "MAX_FILE_SECONDS", 0.0)
    index = flag_index.build_index(tree, tmp_path / "slow.sqlite", workers=1)
    (note,) = index.unread
    assert note.startswith("not read (over 0 s to walk): sglang/srt/server_args.py, ")  # every file
    assert "sglang/srt/layers/again.py" in note and len(note.split(", ")) == 11


def test_a_guard_of_a_thousand_terms_lists_the_first_ones(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A generated `if a and b and ...` (flat: within the depth limit) on a reader: its evidence lists
    the first `MAX_TERMS` terms that name a fact and counts the rest, and the guard is left open."""
    test = " and ".join(["server_args.enable_foo", *(f"server_args.dead_knob != {i}" for i in range(1000))])
    files = {**FILES, "srt/layers/wide.py": f"def wide(server_args):\n    if {test}:\n        return 1\n"}
    tree = synthetic_tree(tmp_path, monkeypatch, files, "9.9.9")
    verdict = analyze_flag(load_index(tree), "--enable-foo", {**FACTS, "server.dead_knob": 5000})
    (found,) = [f for f in verdict.findings if "wide.py" in f.location]
    assert len(found.conditions) == findings.MAX_TERMS == 256  # the first term is the flag: no fact
    assert found.conditions[0] == {
        "condition": "server_args.dead_knob != 0",
        "fact": "server.dead_knob = 5000",
        "outcome": "pass",
    }
    assert found.conditions[-1]["condition"] == "(745 more terms, not checked)"
    assert found.state == "runtime" and found.why == f"open: {TOO_LARGE.strip('()')}"


def test_flag_definitions_nested_too_deeply_keep_their_flags(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A default, a help text and a type a thousand levels deep in the flags' own definitions (Python
    runs them): the catalog keeps every flag, those values unknown; the file's walk is left unread."""
    deep = " + ".join(["1"] * 1000)
    server_args = textwrap.dedent(FILES["srt/server_args.py"])
    server_args = server_args.replace("dead_knob: int = 1", f"dead_knob: int = {deep}")
    server_args = server_args.replace('help="Foo."', f"help={deep}")
    server_args = server_args.replace("type=int, default=ServerArgs.dead_knob", f"type={deep}")
    tree = synthetic_tree(tmp_path, monkeypatch, {**FILES, "srt/server_args.py": server_args}, "9.9.9")
    catalog = {f.name: f for f in flag_catalog(tree)}
    assert len(catalog) == 7
    assert catalog["--dead-knob"].default is None and catalog["--dead-knob"].type is None
    assert catalog["--enable-foo"].help == "" and catalog["--enable-foo"].type == "bool"
    index = load_index(tree)
    assert index.unread == ["not read (nested more than 100 levels deep): sglang/srt/server_args.py"]
    verdict = analyze_flag(index, "--enable-foo", FACTS)
    assert verdict.verdict == "applies" and index.unread[0] in verdict.notes


def test_directories_nested_a_thousand_deep_are_walked_without_recursion(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tree = synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.9")
    top = deep = tree.package_dir / "srt" / "d"
    top.mkdir()
    for _ in range(1100):  # `os.makedirs` itself recurses: one level at a time
        deep = deep / "d"
        deep.mkdir()
    (deep / "bottom.py").write_text("def bottom(server_args):\n    return server_args.enable_foo\n")
    try:
        index = load_index(tree)
        assert index.unread == []
        bottom = tree.rel(deep / "bottom.py")
        assert bottom in _read_paths(index)
        verdict = analyze_flag(index, "--enable-foo", FACTS)
        assert any(f.location == f"{bottom}:2" for f in verdict.findings)
    finally:  # bottom up: pytest's own clean-up (`shutil.rmtree`) recurses too
        (deep / "bottom.py").unlink()
        while deep != top.parent:
            deep.rmdir()
            deep = deep.parent


def test_a_thousand_tables_each_copying_the_last_do_not_exhaust_the_stack(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A class held in a table that 999 tables copy in turn: whether the class is built is followed
    `MAX_COPIES` copies down, then left open (the reader stays on, as for a short chain)."""
    text = "class Held:\n    def __init__(self, server_args):\n        if server_args.enable_foo:\n            self.x = 1\n\n"
    text += "T0 = {'a': Held}\n" + "".join(f"T{i} = {{**T{i - 1}}}\n" for i in range(1, 1000))
    text += "\ndef pick(key, server_args):\n    return T999[key](server_args)\n"
    tree = synthetic_tree(tmp_path, monkeypatch, {**FILES, "srt/layers/tables.py": text}, "9.9.9")
    verdict = analyze_flag(load_index(tree), "--enable-foo", FACTS)
    (held,) = [f for f in verdict.findings if f.location == "sglang/srt/layers/tables.py:3"]
    assert held.state == "on", held
