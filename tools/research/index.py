"""The per-version flag index: every flag's readers, guards, call edges and exits, built once.

Building walks every serving-path file of an SGLang tree once (`walk.file.walk_file`, two
worker processes) and stores the result in an SQLite file of pickled records under
`<cache>/flag-index/`, one per tree, keyed by the version, an index format number and a digest of
the files' names, sizes and mtimes; a changed tree rebuilds. Later calls open that file (and keep
it in memory for the process).

Serving path (issue 10, item 4): `srt/**` plus the package's top-level modules, without tests,
benchmarks, examples, `multimodal_gen/` (another product), the `lang/` frontend and `bench_*.py`.
"""

from __future__ import annotations

import ast
import hashlib
import os
import pickle
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import cached_property
from pathlib import Path, PurePosixPath

from tools.research import index_tables
from tools.research.catalog import FlagInfo, flag_catalog
from tools.research.index_types import Call, Func, ModuleFacts, Read
from tools.research.source import SourceTree, cache_lock, cache_root
from tools.research.walk.file import LOG, walk_file
from tools.research.walk.names import KEYS

INDEX_FORMAT = 33
TABLE_READ = Call("<table>", 0, [], [], {})
"""The call of a `call_sites` pair whose caller takes an entry out of a table holding the function."""
MAX_FILE_BYTES = 4 * 2**20
"""A Python file larger than this is not indexed (the index notes it: `FlagIndex.skipped`)."""
_OFF_PATH_DIRS = frozenset(
    {
        "test",
        "tests",
        "benchmark",
        "benchmarks",
        "bench",
        "examples",
        "example",
        "multimodal_gen",
        "lang",
        "eval",
    }
)
_TOP_LEVEL_OFF = ("bench_", "check_env", "profiler", "compile_deep_gemm")
_CONFIG_PATHS = ("srt/server_args.py", "srt/arg_groups/")


def off_path_reason(rel: str) -> str | None:
    """Why a file (relative to the `sglang/` package) is not on the serving path, or None if it is."""
    parts = PurePosixPath(rel).parts
    name = parts[-1]
    if any(p in _OFF_PATH_DIRS for p in parts[:-1]):
        hit = next(p for p in parts[:-1] if p in _OFF_PATH_DIRS)
        return f"under {hit}/"
    if name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py":
        return "test code"
    if len(parts) == 1 and name.startswith(_TOP_LEVEL_OFF):
        return "a tool, not the server"
    if len(parts) > 1 and parts[0] != "srt":
        return f"outside srt/ ({parts[0]}/)"
    return None


def is_config_path(path: str) -> bool:
    """Argument definition and resolution code (`server_args.py`, `arg_groups/`)."""
    return any(p in path for p in _CONFIG_PATHS)


class FlagIndex:
    """The index of one tree in a SQLite file, read lazily. Paths are relative to the tree root.

    Reads are stored per dest, functions per `path::qual` (looked up by last name for call edges);
    the import graph, model classes and registry keys are one blob each (dispatch context).
    """

    def __init__(self, db: Path):
        self.db = db
        self._con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, check_same_thread=False)
        meta = dict(self._con.execute("SELECT key, data FROM meta"))
        self.version: str = pickle.loads(meta["version"])
        self.prefix: str = pickle.loads(meta["prefix"])
        self._meta = meta
        self._funcs: dict[str, Func | None] = {}
        self._names: dict[str, list[str]] = {}
        self._imports_of: dict[str, set[str | None]] = {}

    @cached_property
    def catalog(self) -> list[FlagInfo]:
        """The flag catalog the index was built with."""
        return pickle.loads(self._meta["catalog"])

    @cached_property
    def config_attrs(self) -> dict[str, tuple[str, frozenset[str]]]:
        """`self.<attr>` -> (the model-config expression it is set from, the classes that set it
        otherwise) (`index_tables.config_attrs`)."""
        return pickle.loads(self._meta["config_attrs"]) if "config_attrs" in self._meta else {}

    @cached_property
    def enums(self) -> dict[str, dict[str, object]]:
        """Enum class -> members and their values (`index_tables.enums`)."""
        return pickle.loads(self._meta["enums"]) if "enums" in self._meta else {}

    @cached_property
    def class_builders(self) -> frozenset[str]:
        """Names of the methods that build their class (`return cls(...)`), anywhere in the tree."""
        return pickle.loads(self._meta["builders"]) if "builders" in self._meta else frozenset()

    @cached_property
    def loads(self) -> frozenset[str]:
        """Attribute names read anywhere in the tree (`index_tables.loads`)."""
        return pickle.loads(self._meta["loads"]) if "loads" in self._meta else frozenset()

    @cached_property
    def requires(self) -> frozenset[str]:
        """Packages every server of this version installs (`index_tables.server_requirements`)."""
        return pickle.loads(self._meta["requires"]) if "requires" in self._meta else frozenset()

    @cached_property
    def skipped(self) -> list[str]:
        """Files left out of the index for their size (`path (N MB)`)."""
        return pickle.loads(self._meta["skipped"]) if "skipped" in self._meta else []

    @cached_property
    def modules(self) -> dict[str, ModuleFacts]:
        """Every serving-path module's imports, constants and classes (functions and reads left out)."""
        return pickle.loads(self._meta["modules"])

    @cached_property
    def mod_path(self) -> dict[str, str]:
        """Dotted module name -> path."""
        return {m.module: p for p, m in self.modules.items()}

    @cached_property
    def import_graph(self) -> list[tuple[str, str, tuple[str, ...], tuple[tuple[str, str], ...]]]:
        """Every import between serving-path modules: (imported path, importer path, guards, keys)."""
        return pickle.loads(self._meta["import_graph"])

    @cached_property
    def registries(self) -> list[tuple[str, str, str, list[str]]]:
        """(decorator, key, path, imported modules) of every `@register_x("key")` function."""
        return pickle.loads(self._meta["registries"])

    @cached_property
    def overrides(self) -> dict[str, list[tuple[str, str, int]]]:
        """Dest -> (path, qual, line) of every guarded `return {"dest": value}` and, in argument
        resolution code, every `self.dest = <constant>` (see `Exit`, `Func.sets`)."""
        return pickle.loads(self._meta["overrides"])

    @cached_property
    def cuda(self) -> str | None:
        """The CUDA version of the torch the version's wheel pins (`index_tables.torch_cuda`)."""
        return pickle.loads(self._meta["cuda"]) if "cuda" in self._meta else None

    @cached_property
    def fills(self) -> dict[str, list[tuple[str, str, int]]]:
        """Dest -> (path, qual, line) of every `server_args.dest = <value>` outside argument code:
        a setting the server fills in after start-up resolution (at model load)."""
        return pickle.loads(self._meta["fills"]) if "fills" in self._meta else {}

    @cached_property
    def _subclasses(self) -> dict[str, list[tuple[str, str]]]:
        out: dict[str, list[tuple[str, str]]] = {}
        for path, m in self.modules.items():
            for cls, bases in m.bases.items():
                for base in bases:
                    out.setdefault(base, []).append((path, cls))
        return out

    def subclasses(self, name: str) -> list[tuple[str, str]]:
        """(path, class) of every class of the tree that names a base called `name`."""
        return self._subclasses.get(name, [])

    def reads(self, dest: str) -> list[Read]:
        """Every read of `dest` on the serving path, in path/line order."""
        row = self._con.execute("SELECT data FROM reads WHERE dest = ?", (dest,)).fetchone()
        return pickle.loads(row[0]) if row else []

    def func(self, path: str, qual: str) -> Func | None:
        """The function `qual` (e.g. `Class.method`) of `path`."""
        key = f"{path}::{qual}"
        if key not in self._funcs:
            row = self._con.execute("SELECT data FROM funcs WHERE key = ?", (key,)).fetchone()
            self._funcs[key] = pickle.loads(row[0]) if row else None
        return self._funcs[key]

    def funcs_in(self, path: str) -> list[Func]:
        """Every function of one file."""
        rows = self._con.execute(
            "SELECT data FROM funcs WHERE key >= ? AND key < ?", (path + "::", path + ":;")
        )
        return [pickle.loads(r[0]) for r in rows]

    def _by_name(self, name: str) -> list[str]:
        """Functions named `name`, and the `__init__` of a class named `name` (a constructor call)."""
        if name not in self._names:
            query = "SELECT key FROM funcs WHERE name = ? UNION SELECT key FROM ctors WHERE name = ?"
            rows = self._con.execute(query, (name, name)).fetchall()
            self._names[name] = [r[0] for r in rows]
        return self._names[name]

    def _imported(self, caller: Func) -> set[str | None]:
        """Paths of the modules `caller` (or its module) imports; memoized per module."""
        key = caller.path
        if key not in self._imports_of:
            mod = self.modules.get(caller.path)
            names = mod.imports if mod else []
            self._imports_of[key] = {self.mod_path.get(i) for i in names} | {
                self.mod_path.get(i.rsplit(".", 1)[0]) for i in names
            }
        own = {self.mod_path.get(i) for i in caller.imports} | {
            self.mod_path.get(i.rsplit(".", 1)[0]) for i in caller.imports
        }
        return self._imports_of[key] | own

    def call_sites(
        self, func: Func, *, limit: int = 24, uses: bool = False
    ) -> list[tuple[Func, Call | None]] | None:
        """Where `func` is called on the serving path: (caller, call) pairs; None when some code
        uses it without calling it (a callback, a dispatch table), so its call sites are not all
        known, or when more than `limit` functions call a function of that name. `uses`: such a
        use is a (caller, None) pair instead (whoever asks decides whether that caller runs)."""
        name = _class_of_init(func.qual) or func.qual.rsplit(".", 1)[-1]  # `Class(...)` calls its __init__
        query = "SELECT caller, called FROM callers WHERE callee = ? LIMIT ?"
        rows = self._con.execute(query, (name, limit + 1)).fetchall()
        if len(rows) > limit:
            return None
        sites: list[tuple[Func, Call]] = []
        for key, called in rows:
            path, qual = key.split("::", 1)
            if qual.startswith("<table "):  # held in a table: used where the table is read
                readers = self._table_readers(path, qual.removeprefix("<table ").removesuffix(">"))
                if readers is None or not uses:
                    return None
                sites += [(r, TABLE_READ) for r in readers]
                continue
            caller = self.func(path, qual) if qual != "<module>" else None
            targets = self.resolve_call(caller, name) if caller is not None else []
            if not targets:
                return None  # a call (or use) whose target is not resolved may be this function
            if any(t.path == func.path and t.qual == func.qual for t in targets):
                if not called:
                    if not uses:
                        return None
                    sites.append((caller, None))
                    continue
                sites += [(caller, c) for c in caller.calls if c.callee == name]
        return sites

    def _table_readers(self, path: str, table: str, seen: frozenset[str] = frozenset()) -> list[Func] | None:
        """The functions that read the module-level table `path::table`, directly or through a
        table that copies it (`{**BASE}`); its own module's top-level code only fills it in
        (`BASE.update(...)`). None when other module-level code reads it, or nothing does."""
        rows = self._con.execute("SELECT caller FROM callers WHERE callee = ?", (table,)).fetchall()
        out: list[Func] = []
        for (key,) in rows:
            p, qual = key.split("::", 1)
            if qual.startswith("<table ") and p == path and key not in seen:
                copied = self._table_readers(p, qual.removeprefix("<table ").removesuffix(">"), seen | {key})
                if copied is None:
                    return None
                out += copied
                continue
            if qual == "<module>" and p == path:
                mod = self.modules.get(p)
                if mod is None or table in mod.loose:
                    return None  # its own top-level code does more with it than fill it in
                continue
            func = self.func(p, qual) if not qual.startswith("<") else None
            if func is None:
                return None
            if table in func.tested:
                continue  # `name in TABLE`: takes no entry out
            if self._only_probes(func, path, table):
                continue  # `for _, m in TABLE.items(): m.probe(x)`: builds no entry
            if p == path or path in self._imported(func):
                out.append(func)
        return out or None

    def _only_probes(self, func: Func, path: str, table: str) -> bool:
        """Whether `func` takes entries out of `path::table` only to call methods that build
        nothing (no method of that name anywhere in the tree calls `cls(...)`), or only its keys."""
        methods = func.probed.get(table)
        if methods is None or set(methods) & self.class_builders:
            return False
        module = self.modules.get(path)
        return KEYS not in methods or (module is not None and table in module.keyed)

    def callers_of(self, name: str, *, limit: int = 40) -> list[tuple[str, str, bool]]:
        """(path, qualified name or `<module>`, called) of what calls or uses a function named `name`
        (a class name: its constructor), up to `limit` rows."""
        rows = self._con.execute("SELECT caller, called FROM callers WHERE callee = ? LIMIT ?", (name, limit))
        return [(*key.split("::", 1), bool(called)) for key, called in rows]

    def query(self, name: str, arity: int = 0) -> tuple[str, dict[str, str], str] | None:
        """A one-line query function named `name`, evaluated in place of a call with `arity`
        arguments (0, or 1: the server args, as in `attn_dp_enabled_of(view)`): (its returned
        expression, its module's constants, `path::qual`); None unless the name is defined once,
        takes that many arguments and its body is a single `return <expr>`. A method named
        `Class.method` (a tree enum's, `arity` -1) is given as a `lambda` of its parameters: its
        early returns in order, then its single return (or nothing known)."""
        if "." in name:
            return self._method(name)
        keys = self._by_name(name)
        if len(keys) != 1:
            return None
        func = self.func(*keys[0].split("::", 1))
        if (
            func is None
            or not func.value
            or len([p for p in func.params if p not in ("self", "cls")]) != arity
        ):
            return None
        module = self.modules.get(func.path)
        return func.value, module.consts if module else {}, keys[0]

    def _method(self, qual: str) -> tuple[str, dict[str, str], str] | None:
        keys = [k for k in self._by_name(qual.rsplit(".", 1)[-1]) if k.endswith(f"::{qual}")]
        func = self.func(*keys[0].split("::", 1)) if len(keys) == 1 else None
        if func is None or not (func.value or func.gates):
            return None
        body = f"({func.value})" if func.value else "__not_followed__"
        for gate in reversed(
            [g for g in func.gates if g.kind == "return" and g.message.startswith("return ")]
        ):
            test = " and ".join(f"({g})" for g in gate.guards) or "True"
            body = f"({gate.message.removeprefix('return ')}) if ({test}) else {body}"
        module = self.modules.get(func.path)
        return f"lambda {', '.join(func.params)}: {body}", module.consts if module else {}, keys[0]

    def package_rel(self, path: str) -> str:
        """`sglang/srt/x.py` -> `srt/x.py`."""
        return path[len(self.prefix) :] if path.startswith(self.prefix) else path

    def resolve_call(self, caller: Func, callee: str) -> list[Func]:
        """Candidate targets of a call by name: same module first, then modules the caller imports,
        then a name defined once in the whole tree; an ambiguous name resolves to nothing."""
        keys = self._by_name(callee)
        if not keys:
            return []
        same = [k for k in keys if k.startswith(caller.path + "::")]
        if not same:
            imported = self._imported(caller)
            same = [k for k in keys if k.split("::", 1)[0] in imported] or (keys if len(keys) == 1 else [])
        out = []
        for k in same:
            path, qual = k.split("::", 1)
            f = self.func(path, qual)
            if f is not None:
                out.append(f)
        return out


def _files(tree: SourceTree) -> list[tuple[str, str, bool]]:
    """Serving-path Python files: (path relative to the tree root, dotted module, is a package)."""
    out = []
    pkg = tree.package_dir
    for dirpath, dirnames, filenames in os.walk(pkg):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            full = Path(dirpath) / name
            rel_pkg = full.relative_to(pkg).as_posix()
            if off_path_reason(rel_pkg) or full.stat().st_size > MAX_FILE_BYTES:
                continue
            parts = [pkg.name, *rel_pkg[:-3].split("/")]
            is_pkg = parts[-1] == "__init__"
            module = ".".join(parts[:-1] if is_pkg else parts)
            out.append((tree.rel(full), module, is_pkg))
    return out


def too_big(tree: SourceTree) -> list[str]:
    """Serving-path files left out of the index because they are over `MAX_FILE_BYTES` (generated
    tables, vendored blobs: no flag handling reads like that, and one would cost minutes and GBs)."""
    big = [p for p in tree.package_dir.rglob("*.py") if p.stat().st_size > MAX_FILE_BYTES]
    return [
        f"{tree.rel(p)} ({p.stat().st_size / 2**20:.0f} MB)"
        for p in sorted(big)
        if not off_path_reason(p.relative_to(tree.package_dir).as_posix())
    ]


def _digest(tree: SourceTree) -> str:
    """The cache key: version, location, and the stats of the package, `srt/` and the flag
    definitions. Why not every file: stat-ing ~5000 files costs ~1 s per call; an edited checkout is
    re-indexed with `load_index(..., rebuild=True)` (`optagent research --rebuild-index`)."""
    h = hashlib.sha256(f"{INDEX_FORMAT}\0{tree.version}\0{tree.root.resolve()}".encode())
    pkg = tree.package_dir
    marks = [pkg, pkg / "srt", pkg / "srt" / "server_args.py", pkg / "srt" / "arg_groups" / "fields"]
    marks += sorted((pkg / "srt" / "arg_groups" / "fields").glob("*.py"))
    for p in marks:
        if p.exists():
            st = p.stat()
            h.update(f"{p.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _walk_chunk(args: tuple[str, list[tuple[str, str, bool]], frozenset[str]]) -> list[ModuleFacts]:
    root, files, dests = args
    return [
        walk_file(rel, module, (Path(root) / rel).read_text(errors="replace"), dests, is_pkg)
        for rel, module, is_pkg in files
    ]


def _write(db: Path, tree: SourceTree, catalog: list[FlagInfo], facts: list[ModuleFacts]) -> None:
    """Store the walked facts in a new SQLite file at `db`."""
    con = sqlite3.connect(db)
    con.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, data BLOB);"
        "CREATE TABLE reads (dest TEXT PRIMARY KEY, data BLOB);"
        "CREATE TABLE funcs (key TEXT PRIMARY KEY, name TEXT, data BLOB);"
        "CREATE TABLE callers (callee TEXT, caller TEXT, called INTEGER);"
        "CREATE TABLE ctors (name TEXT, key TEXT);"
    )
    ctors = [(c, f"{f.path}::{f.qual}") for m in facts for f in m.funcs if (c := _class_of_init(f.qual))]
    defined = {f.qual.rsplit(".", 1)[-1] for m in facts for f in m.funcs} | {c for c, _ in ctors}
    defined |= {t for m in facts for t in m.tables}  # a table's readers are its holdings' users
    reads: dict[str, list[Read]] = {}
    registries: list[tuple[str, str, str, list[str]]] = []
    overrides: dict[str, list[tuple[str, str, int]]] = {}
    fills: dict[str, list[tuple[str, str, int]]] = {}
    rows = []
    callers: set[tuple[str, str, int]] = set()
    builders = frozenset(
        f.qual.rsplit(".", 1)[-1] for m in facts for f in m.funcs if any(c.callee == "cls" for c in f.calls)
    )
    for m in facts:
        for read in m.reads:
            reads.setdefault(read.dest, []).append(read)
        callers |= {(name, f"{m.path}::<module>", 0) for name in m.refs if name in defined}
        callers |= {
            (n, f"{m.path}::<table {t}>", 0) for t, held in m.tables.items() for n in held if n in defined
        }
        for f in m.funcs:
            key = f"{f.path}::{f.qual}"
            f.outside = [c for c in f.calls if c.callee not in defined and not LOG.search(c.callee)]
            f.calls = [c for c in f.calls if c.callee in defined]  # only edges into this tree
            f.refs = sorted({r for r in f.refs if r in defined})
            callers |= {(c.callee, key, 1) for c in f.calls} | {(r, key, 0) for r in f.refs}
            registries += [(deco, key, f.path, f.imports) for deco, key in f.keys]
            config = is_config_path(f.path)
            f.sets = [e for e in f.sets if (e.kind == "fill") != config]
            for e in f.sets if not config else []:
                fills.setdefault(e.sets[0], []).append((f.path, f.qual, e.line))
            for e in [*f.exits, *f.sets]:
                for dest in e.sets if e.kind in ("override", "assign") else []:
                    overrides.setdefault(dest, []).append((f.path, f.qual, e.line))
            rows.append((key, f.qual.rsplit(".", 1)[-1], _dump(f)))
        m.funcs, m.reads, m.refs = [], [], []
    con.executemany("INSERT OR IGNORE INTO funcs VALUES (?, ?, ?)", rows)
    con.execute("CREATE INDEX funcs_name ON funcs (name)")
    con.executemany("INSERT INTO callers VALUES (?, ?, ?)", sorted(callers))
    con.execute("CREATE INDEX callers_callee ON callers (callee)")
    con.executemany("INSERT INTO ctors VALUES (?, ?)", ctors)
    con.execute("CREATE INDEX ctors_name ON ctors (name)")
    con.executemany(
        "INSERT INTO reads VALUES (?, ?)",
        [(d, _dump(sorted(rs, key=lambda r: (r.path, r.line)))) for d, rs in reads.items()],
    )
    mod_path = {m.module: m.path for m in facts}
    attrs = index_tables.config_attrs(facts)
    graph = []
    for m in facts:
        for name, guards, keys in m.edges:
            target = mod_path.get(name) or mod_path.get(name.rsplit(".", 1)[0])
            if target and target != m.path:
                graph.append((target, m.path, guards, keys))
        m.edges = []
    meta = {
        "import_graph": graph,
        "version": tree.version,
        "prefix": tree.rel(tree.package_dir) + "/",
        "catalog": catalog,
        "modules": {m.path: m for m in facts},
        "registries": registries,
        "overrides": overrides,
        "fills": fills,
        "skipped": too_big(tree),
        "requires": index_tables.server_requirements(tree),
        "cuda": index_tables.torch_cuda(tree),
        "config_attrs": attrs,
        "enums": index_tables.enums(facts),
        "loads": index_tables.loads(facts),
        "builders": builders,
    }
    con.executemany("INSERT INTO meta VALUES (?, ?)", [(k, _dump(v)) for k, v in meta.items()])
    con.commit()
    con.close()


def _class_of_init(qual: str) -> str | None:
    """`Class` for `Class.__init__` (a module-level class's constructor), else None."""
    cls, _, name = qual.partition(".")
    return cls if name == "__init__" else None


def _dump(value: object) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _private_fields(
    tree: SourceTree, files: list[tuple[str, str, bool]], dests: frozenset[str]
) -> frozenset[str]:
    """Settings argument resolution keeps beside the flags (`_x_explicitly_set`, declared in a class
    of argument code that declares flags too): resolution may change them with a flag, and what
    reads them decides (their reads are indexed like a flag's)."""
    out: set[str] = set()
    for rel, _, _ in files:
        if not is_config_path(rel):
            continue
        try:
            module = ast.parse((tree.root / rel).read_text(errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for cls in (n for n in ast.walk(module) if isinstance(n, ast.ClassDef)):
            names = [
                s.target.id
                for s in cls.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            ]
            if any(n in dests for n in names):
                out |= {n for n in names if n.startswith("_") and not n.startswith("__")}
    return frozenset(out)


def build_index(tree: SourceTree, db: Path, *, workers: int = 2) -> FlagIndex:
    """Walk every serving-path file of `tree` (in `workers` processes) into a new index at `db`."""
    catalog = flag_catalog(tree)
    files = _files(tree)
    dests = frozenset(f.dest for f in catalog)
    dests |= _private_fields(tree, files, dests)
    if workers > 1 and threading.active_count() > 1:
        # forking a multi-threaded process (the agent researches from worker threads) can deadlock
        # on a lock another thread holds, and spawn re-runs the caller's __main__: build in a fresh
        # interpreter instead (`python -m tools.research.index ROOT VERSION DB`), which may fork freely
        argv = [sys.executable, "-m", "tools.research.index", str(tree.root), tree.version, str(db)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode == 0 and db.is_file():
            return FlagIndex(db)
        workers = 1  # the subprocess failed (e.g. no `tools` on its path): walk in this process
    if workers > 1:
        chunks = [files[i::workers] for i in range(workers)]
        with ProcessPoolExecutor(workers) as pool:
            parts = list(pool.map(_walk_chunk, [(str(tree.root), c, dests) for c in chunks]))
    else:
        parts = [_walk_chunk((str(tree.root), files, dests))]
    tmp = db.with_suffix(f".tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    db.parent.mkdir(parents=True, exist_ok=True)
    _write(tmp, tree, catalog, [m for part in parts for m in part])
    os.replace(tmp, db)  # readers never see a half-written index
    prefix = db.name.rsplit("-", 1)[0] + "-"
    for old in db.parent.glob(prefix + "*"):  # earlier builds of this tree, their status caches
        if old != db and old.name.startswith(prefix) and not old.name.startswith(db.stem):
            old.unlink(missing_ok=True)
    return FlagIndex(db)


_LOADED: dict[tuple[str, str], FlagIndex] = {}


def index_path(tree: SourceTree, cache_dir: Path | None = None) -> Path:
    """Where the index of `tree` lives on disk: `<version>-<tree>-<digest>.sqlite`. The tree part
    keeps two trees (or installs) of one version apart, so a rebuild replaces only its own tree's
    older indexes (see `build_index`)."""
    digest = _digest(tree)
    safe = "".join(c if c.isalnum() or c in ".-_" else "_" for c in tree.version or "unknown")
    where = hashlib.sha256(str(tree.root.resolve()).encode()).hexdigest()[:8]
    return cache_root(cache_dir) / "flag-index" / f"{safe.replace('-', '_')}-{where}-{digest}.sqlite"


def load_index(
    tree: SourceTree,
    *,
    cache_dir: Path | None = None,
    rebuild: bool = False,
    progress: Callable[[str], None] | None = None,
) -> FlagIndex:
    """The index of `tree`: from memory, else from disk, else built and saved. `progress(text)` is
    called once before a build (a minute or two; the caller shows it)."""
    key = (str(tree.root.resolve()), tree.version)
    if not rebuild and key in _LOADED:
        return _LOADED[key]
    path = index_path(tree, cache_dir)
    with cache_lock(path):  # another process building this tree's index: wait for it, then read it
        index: FlagIndex | None = None
        if path.is_file() and not rebuild:
            try:
                index = FlagIndex(path)
            except (sqlite3.Error, KeyError, pickle.UnpicklingError):
                index = None  # a damaged file is rebuilt
        if index is None:
            if progress is not None:
                progress(f"building the code index of SGLang {tree.version} (once per source tree)")
            index = build_index(tree, path)
    _LOADED[key] = index
    return index


# `python -m tools.research.index ROOT VERSION DB`: build one index (see build_index)
if __name__ == "__main__":
    from tools.research.source import local_source

    build_index(local_source(Path(sys.argv[1]), version=sys.argv[2]), Path(sys.argv[3]))
