"""Where a flag is read, under which conditions, and whether anything follows from it.

A reader is any load of the flag's dest: `server_args.x`, `self.server_args.x`, `get_exec().moe.x`,
`cfg.x`, `global_server_args_dict["x"]`, `d.get("x")`, `getattr(obj, "x")`. Its guards are the
conditions it is combined with (`a and x and topk > 2` → `a`, `topk > 2`) and those of every
enclosing `if`/`while`/conditional expression up to its function. Readers inside argument
definition and resolution code (`srt/server_args.py`, `srt/arg_groups/`) are `config` readers;
the rest are `use` readers. A flag with no effective reader outside config code is dead.

The conditions around a read and its effect are worked out in `scan/read_context.py`.
"""

from __future__ import annotations

import ast
import bisect
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any

from tools.research.catalog import FlagInfo, find_flag, flag_catalog
from tools.research.scan.read_context import _effect, _guards, _in_add_argument
from tools.research.search import grep
from tools.research.source import SourceTree

_CONFIG_PATHS = ("srt/server_args.py", "srt/arg_groups/")


@dataclass
class Reader:
    """One place the flag is read: `path:line`, the line's text, and the conditions around it."""

    path: str
    line: int
    text: str
    guards: list[str] = field(default_factory=list)
    kind: str = "use"
    """`use` (runtime code) or `config` (argument definition, resolution, validation)."""
    function: str = "<module>"
    effect: str | None = None
    """What the read feeds: `assigned to use_x`, `sets other_flag`, or `only logged`."""
    inert: bool = False

    def __str__(self) -> str:
        guard = f"  [if {' and '.join(self.guards)}]" if self.guards else ""
        return f"{self.path}:{self.line}: {self.text.strip()}{guard}"


@dataclass
class FlagReport:
    """A flag's definition, its readers with guards, and the dead/no-op verdict with reasons."""

    flag: FlagInfo | None
    dest: str
    readers: list[Reader] = field(default_factory=list)
    dead: bool = False
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


_BLOCK_START = re.compile(r"^(?!(?:else|elif|except|finally)\b)[A-Za-z_@]")


@lru_cache(maxsize=64)
def _source(path: Path, mtime: float) -> tuple[list[str], tuple[int, ...]]:
    """The file's lines and the 1-based first lines of its top-level blocks (decorators included)."""
    lines = path.read_text(errors="replace").split("\n")
    starts, in_string, prev_decorator = [], False, False
    for number, line in enumerate(lines, start=1):
        if not in_string and _BLOCK_START.match(line) and not prev_decorator:
            starts.append(number)
        if not in_string:
            prev_decorator = line.startswith("@")
        if (line.count('"""') + line.count("'''")) % 2:
            in_string = not in_string
    return lines, tuple(starts)


@lru_cache(maxsize=4096)
def _parsed_block(path: Path, mtime: float, start: int, end: int) -> ast.Module:
    """One top-level block parsed alone (line numbers kept); the whole file when it does not parse."""
    lines, _ = _source(path, mtime)
    try:
        return ast.parse("\n" * (start - 1) + "\n".join(lines[start - 1 : end]), filename=str(path))
    except SyntaxError:
        return ast.parse("\n".join(lines), filename=str(path))


def _parsed(path: Path, hit_lines: list[int]) -> tuple[list[ast.Module], list[str]]:
    """The top-level blocks of `path` that contain a hit line, parsed (whole file if the split fails)."""
    mtime = path.stat().st_mtime
    lines, starts = _source(path, mtime)
    blocks = {}
    for hit in hit_lines:
        i = bisect.bisect_right(starts, hit) - 1
        start = starts[i] if i >= 0 else 1
        end = starts[i + 1] - 1 if i + 1 < len(starts) else len(lines)
        blocks[(start, end)] = None
    return [_parsed_block(path, mtime, a, b) for a, b in blocks], lines


def _reads(module: ast.Module, dest: str, lines: list[int]) -> list[tuple[ast.AST, dict[ast.AST, ast.AST]]]:
    """Reads of `dest`, each with the parent links of its ancestors; only subtrees that span a line
    where the name occurs (from the text search) are visited, which keeps big files cheap."""
    found: list[tuple[ast.AST, dict[ast.AST, ast.AST]]] = []

    def spans_hit(node: ast.AST) -> bool:
        start = getattr(node, "lineno", None)
        if start is None:
            return True
        i = bisect.bisect_left(lines, start)
        return i < len(lines) and lines[i] <= (node.end_lineno or start)

    def visit(node: ast.AST, stack: list[ast.AST]) -> None:
        for child in ast.iter_child_nodes(node):
            if not spans_hit(child):
                continue
            path = [*stack, node]
            if _is_read(child, dest):
                parents = {path[i + 1]: path[i] for i in range(len(path) - 1)}
                parents[child] = node
                found.append((child, parents))
            visit(child, path)

    visit(module, [])
    return found


def _is_read(node: ast.AST, dest: str) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == dest and isinstance(node.ctx, ast.Load)
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(node.ctx, ast.Load) and isinstance(key, ast.Constant) and key.value == dest
    if isinstance(node, ast.Call) and node.args:
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        key = node.args[1] if name in ("getattr", "hasattr") and len(node.args) > 1 else node.args[0]
        return name in ("getattr", "hasattr", "get") and isinstance(key, ast.Constant) and key.value == dest
    return False


def is_test_path(rel: str) -> bool:
    """Whether `rel` is test code: under a `test`/`tests` directory, or `test_*.py`, `*_test.py`, `conftest.py`."""
    *dirs, name = PurePosixPath(rel.replace("\\", "/")).parts
    if any(d in ("test", "tests") for d in dirs):
        return True
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


def find_readers(tree: SourceTree, dest: str) -> list[Reader]:
    """Every read of `dest` in the tree's Python files, with guards, in path/line order.

    Test code (`is_test_path`) is left out: a flag read only by tests changes nothing in a server.
    """
    if not dest.isidentifier():
        raise ValueError(f"not a flag dest: {dest!r}")
    hits = grep(tree, rf"\b{dest}\b", glob="*.py", max_results=100_000)
    by_file: dict[str, list[int]] = {}
    for m in hits.matches:
        if is_test_path(m.path):
            continue
        by_file.setdefault(m.path, []).append(m.line)
    readers: list[Reader] = []
    for rel, lines in by_file.items():
        path = tree.root / rel
        try:
            modules, text = _parsed(path, lines)
        except SyntaxError:
            continue
        kind = "config" if any(p in rel for p in _CONFIG_PATHS) else "use"
        found = [read for module in modules for read in _reads(module, dest, sorted(lines))]
        seen: set[tuple[int, int]] = set()  # blocks that fell back to the whole file overlap
        for node, parents in found:
            if (node.lineno, node.col_offset) in seen:
                continue
            seen.add((node.lineno, node.col_offset))
            if _in_add_argument(node, parents):
                continue
            guards, function, statement = _guards(node, parents)
            effect, inert = _effect(node, statement, parents, dest)
            readers.append(
                Reader(rel, node.lineno, text[node.lineno - 1], guards, kind, function, effect, inert)
            )
    readers.sort(key=lambda r: (r.path, r.line))
    return readers


def research_flag(tree: SourceTree, flag: str, *, catalog: list[FlagInfo] | None = None) -> FlagReport:
    """Definition, readers with guards, and the dead/no-op verdict of `flag` in `tree`."""
    info = find_flag(catalog if catalog is not None else flag_catalog(tree), flag)
    dest = info.dest if info else flag.strip().lstrip("-").replace("-", "_")
    report = FlagReport(flag=info, dest=dest, readers=find_readers(tree, dest))
    if info is None:
        report.notes.append(
            f"--{dest.replace('_', '-')} is not a launch_server flag of sglang {tree.version}"
        )
    elif info.deprecated:
        report.notes.append(f"deprecated; replacement: {info.replacement or 'none named'}")
    uses = [r for r in report.readers if r.kind == "use"]
    live = [r for r in uses if not r.inert]
    config_effects = [
        r
        for r in report.readers
        if r.kind == "config" and (r.effect or "").startswith(("sets ", "passed to "))
    ]
    report.dead = info is not None and not live and not config_effects
    if report.dead and uses:
        report.notes.append(
            "read only where nothing follows: " + "; ".join(f"{r.path}:{r.line} ({r.effect})" for r in uses)
        )
    elif report.dead:
        where = f"{info.path}:{info.line}" if info else "?"
        report.notes.append(f"dead: defined at {where} but never read outside argument definition/validation")
    elif not live and config_effects:
        report.notes.append(
            "no runtime reader; argument resolution maps it onto other flags: "
            + "; ".join(f"{r.path}:{r.line} {r.effect}" for r in config_effects)
        )
    files = sorted({r.path for r in live})
    if 0 < len(files) <= 3:
        report.notes.append("read at runtime only in: " + ", ".join(files))
    return report


_GUARD_FACTS: list[tuple[str, str]] = [
    (r"\btopk\b|top_k|experts_per_tok", "model"),
    (r"num_experts|n_routed_experts|num_local_experts", "model"),
    (r"\bsm_?\d+|blackwell|hopper|capability|is_sm|\bsm\b", "gpu"),
    (r"tp_size|world_size|nnodes|num_gpus", "count"),
    (r"w8a16|w4a16|fp8|int8|int4|fp4|quant|dtype", "quant"),
    (r"model_arch|architecture|hf_config|is_mimo", "arch"),
    (r"mla|kv_lora|linear_attn|hybrid|mamba|swa|sliding", "attention"),
    (r"nvlink|mnnvl|custom_all_reduce|allreduce", "link"),
]


def guard_facts(guards: list[str], *, model: Any = None, hardware: Any = None) -> list[str]:
    """The model and GPU facts a list of guard expressions mentions (`topk > 2` → `num_experts_per_tok = 8`)."""
    text = " ".join(guards).lower()
    facts: list[str] = []
    for pattern, topic in _GUARD_FACTS:
        if not re.search(pattern, text):
            continue
        if model is not None and topic == "model":
            facts.append(f"num_experts_per_tok = {model.experts_per_tok}, num_experts = {model.num_experts}")
        elif model is not None and topic == "quant":
            facts.append(f"model dtype = {model.dtype}, quantization = {model.quantization}")
        elif model is not None and topic == "arch":
            facts.append(f"architecture = {model.architecture}")
        elif model is not None and topic == "attention":
            facts.append(f"attention kinds = {', '.join(model.attention_kinds)}")
        elif hardware is not None and topic == "gpu":
            facts.append(f"GPU SM arch = {', '.join(hardware.sm_archs)} ({hardware.gpus[0].name})")
        elif hardware is not None and topic == "count":
            facts.append(f"GPUs on the host = {hardware.count}")
        elif hardware is not None and topic == "link":
            facts.append(f"interconnect = {hardware.interconnect}")
    return list(dict.fromkeys(facts))
