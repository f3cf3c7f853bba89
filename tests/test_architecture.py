"""The layout is the architecture (docs/architecture.md): no two modules import each other, directly
or round a longer loop, and the lower layers never import the upper ones.

Every import counts, at module level or inside a function or an `if TYPE_CHECKING:` block: a
function-level import hides a circle, it does not break it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "tools", "sim", "prompts")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports (an import of `a.b.c` counts as `a.b.c` if it is a
    module, else as its nearest enclosing module)."""
    files = {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != mod and not mod.startswith(name + "."):
                    deps.add(name)  # a package's __init__ is not a dependency of its own modules
        graph[mod] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_another_that_imports_it_back() -> None:
    graph = import_graph(ROOT)
    assert len(graph) > 100  # the whole project was read
    assert circles(graph) == []


def test_lower_layers_never_import_upper_ones() -> None:
    graph = import_graph(ROOT)
    wrong = [
        f"{mod} imports {dep}"
        for mod, deps in graph.items()
        for dep in deps
        if (mod.startswith("tools") and dep.startswith("agent"))
        or (mod.startswith(("tools.research", "tools.bench")) and dep.startswith("tools.deploy.deployment"))
        or (mod.startswith("sim") and dep.startswith("agent"))
    ]
    assert wrong == []


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "tools"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from tools.sub.b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import g\n")
    (pkg / "c.py").write_text("import tools.a\n")
    graph = import_graph(tmp_path, ("tools",))
    assert graph["tools.c"] == {"tools.a"}
    assert circles(graph) == [["tools.a", "tools.sub.b"]]
