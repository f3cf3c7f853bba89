"""The index's kept views of a syntax tree answer exactly as `ast` itself does (tools/research/walk/nodes.py)."""

from __future__ import annotations

import ast

from tools.research.walk import nodes


def _files(tree, n: int = 120) -> list:  # type: ignore[no-untyped-def]
    """A spread of SGLang's own files: scheduler, arguments, layers, models."""
    paths = sorted(tree.package_dir.rglob("*.py"))
    return paths[:: max(1, len(paths) // n)]


def test_walk_parents_and_text_match_ast_on_real_sglang(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    checked = plain = 0
    for path in _files(sglang_0523):
        module = ast.parse(path.read_text(errors="replace"))
        try:
            assert nodes.walk(module) == list(ast.walk(module)), path
            # (`ast.Load()` is one object shared by every load: the last parent wins in both)
            assert nodes.parents(module) == {c: n for n in ast.walk(module) for c in ast.iter_child_nodes(n)}
            for node in ast.walk(module):
                if isinstance(node, ast.expr):
                    assert nodes.src(node) == " ".join(ast.unparse(node).split()), (path, node.lineno)
                    checked += 1
                    plain += nodes._plain(node) is not None
        finally:
            nodes.forget()
    assert checked > 10_000 and plain > checked // 2  # the shortcut carries most nodes, and agrees


def test_text_that_the_shortcut_must_not_write_itself() -> None:
    cases = [
        "f('a  b')",  # src folds runs of spaces, inside strings too
        'f("it\'s")',  # a quote inside: the unparser picks the quotes
        "f(*args, **kw)",
        "f(x for x in y)",
        "a.b(c=d.e, f=1.5)",
        "(a or b).c",
        "f(-1, b'x', None, True)",
        "a and not b and c == d and (not e)",  # the unparser binds later operands tighter
        "x or y and z or not w",
        "a[1:2] < b['k'] is not None",
        "f(1.5, 1e-05, 1e400)",
    ]
    for text in cases:
        node = ast.parse(text, mode="eval").body
        assert nodes.src(node) == " ".join(ast.unparse(node).split()), text
    nodes.forget()
    assert not nodes._TEXT and not nodes._NODES
