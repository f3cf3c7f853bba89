"""The flag index of one tree read lazily from its SQLite file (`FlagIndex`): reads per dest,
functions, call edges and the tree-wide tables; `tools.research.index` builds and loads it."""

from __future__ import annotations

import ast
import pickle
import sqlite3
from functools import cached_property
from pathlib import Path

from tools.research.catalog import FlagInfo
from tools.research.guards.terms import HELPER, SET_ONCE, STORED
from tools.research.index_types import Call, Func, ModuleFacts, Read
from tools.research.source_code import function_node, parsed_source
from tools.research.walk.names import KEYS

MAX_COPIES = 8
"""Tables copying a table (`B = {**A}`, `C = {**B}`, ...) followed from it; past these its readers are
not all known. SGLang 0.5.23 copies one table once; a chain of a thousand would exhaust the stack."""
TABLE_READ = Call("<table>", 0, [], [], {})
"""The call of a `call_sites` pair whose caller takes an entry out of a table holding the function."""


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
        self.root: Path | None = None
        """The source tree the index was built from, once loaded for it (`index.load_index`)."""
        self._funcs: dict[str, Func | None] = {}
        self._names: dict[str, list[str]] = {}
        self._imports_of: dict[str, set[str | None]] = {}
        self._settled: dict[tuple[str, ...], tuple[str, dict[str, str], str] | None] = {}
        """`stored` and `set_once` answers: asked for every unknown getter call and `self.x`."""

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
    def computed(self) -> dict[str, str]:
        """Field -> the helper computing it from the server args (`index_tables.computed`)."""
        return pickle.loads(self._meta["computed"]) if "computed" in self._meta else {}

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
    def unread(self) -> list[str]:
        """Serving-path files the build left unread, one note per reason (`budget.Unread.notes`):
        past a budget of the tree, nested too deeply, too many records."""
        return pickle.loads(self._meta["unread"]) if "unread" in self._meta else []

    @cached_property
    def cut(self) -> dict[str, tuple[int, int]]:
        """Dest -> (reads kept, reads on the serving path) of a dest with more reads than the index
        keeps (`budget.MAX_READS`, the first in read order)."""
        return pickle.loads(self._meta["cut"]) if "cut" in self._meta else {}

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
        name = class_of_init(func.qual) or func.qual.rsplit(".", 1)[-1]  # `Class(...)` calls its __init__
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
            if qual == "<module>" and self._holds_only(path, name, func):
                continue  # `forward = Class.forward` in a class body: builds nothing
            caller = self.func(path, qual) if qual != "<module>" else None
            if caller is not None and (caller.path, caller.qual) == (func.path, func.qual):
                continue  # calling itself: it runs only if it already runs
            targets = self.resolve_call(caller, name) if caller is not None else []
            if not targets:
                return None  # a call (or use) whose target is not resolved may be this function
            if any(t.path == func.path and t.qual == func.qual for t in targets):
                if not called:
                    if not uses:
                        return None
                    sites.append((caller, None))
                    continue
                sites += [
                    (caller, c) for c in caller.calls if c.callee == name and self._may_call(caller, c, func)
                ]
        return sites

    def _may_call(self, caller: Func, call: Call, func: Func) -> bool:
        """Whether `call` may be of `func`, by its receiver: `cls.get_fn()` or `self.get_fn()` in a
        class that defines `get_fn` itself calls its own, as `Fn.get_fn()` calls `Fn`'s (0.5.9's
        `CommunicateSummableTensorPairFn.execute` does not call `CommunicateWithAllReduceAndLayerNormFn.get_fn`)."""
        owner, dot, _ = func.qual.rpartition(".")
        recv = call.receiver
        if not dot or recv is None:
            return True
        if recv in ("self", "cls"):
            recv = caller.qual.split(".", 1)[0]
        if recv == owner or self._derives(owner, recv):
            return True  # its own, or an override a subclass's instance runs
        module = self.modules.get(caller.path)
        own = (
            module is not None and recv in module.classes and self.func(caller.path, f"{recv}.{call.callee}")
        )
        return not own

    def _derives(self, cls: str, base: str, depth: int = 8) -> bool:
        """Whether class `cls` derives from a class named `base` (through at most `depth` levels)."""
        kids = {c for _, c in self.subclasses(base)}
        return cls in kids or (depth > 0 and any(self._derives(cls, k, depth - 1) for k in kids if k != base))

    def _holds_only(self, path: str, name: str, func: Func) -> bool:
        """Whether the module-level code of `path` only takes attributes of the class whose
        constructor `func` is (`ModuleFacts.held`), none of them a method that builds it."""
        mod = self.modules.get(path)
        attrs = mod.held.get(name) if mod is not None and class_of_init(func.qual) == name else None
        return attrs is not None and not self.builds_itself(func.path, name, attrs)

    def builds_itself(self, path: str, cls: str, attrs: list[str] | None = None) -> bool:
        """Whether a method of class `cls` of `path` (of those named `attrs`, when given) builds
        the class (`cls(...)`, `Cls(...)`), or a method of one of those names does anywhere (a
        classmethod `from_config` inherited from a base: `return cls(...)`)."""
        own = [f for f in self.funcs_in(path) if f.qual.startswith(f"{cls}.")]
        if attrs is not None:
            if set(attrs) & self.class_builders:
                return True
            own = [f for f in own if f.qual.rsplit(".", 1)[-1] in attrs]
        return any(c.callee in ("cls", cls) for f in own for c in [*f.calls, *f.outside])

    def _table_readers(self, path: str, table: str, seen: frozenset[str] = frozenset()) -> list[Func] | None:
        """The functions that read the module-level table `path::table`, directly or through a
        table that copies it (`{**BASE}`); its own module's top-level code only fills it in
        (`BASE.update(...)`). None when other module-level code reads it, or nothing does."""
        rows = self._con.execute("SELECT caller FROM callers WHERE callee = ?", (table,)).fetchall()
        out: list[Func] = []
        for (key,) in rows:
            p, qual = key.split("::", 1)
            if qual.startswith("<table ") and p == path and key not in seen:
                if len(seen) >= MAX_COPIES:
                    return None  # copies of copies past the limit: its readers are not all known
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
        early returns in order, then its single return (or nothing known). A module-level helper
        (`arity` `HELPER`) is given as a `lambda` of its parameters returning its one `return`'s
        expression (asserts before it aside): its caller binds the arguments."""
        if arity == STORED:
            return self.stored(name)
        if arity == SET_ONCE:
            return self.set_once(*name.rsplit("#", 1))
        if "." in name:
            return self._method(name)
        keys = self._by_name(name)
        if len(keys) != 1:
            return None
        func = self.func(*keys[0].split("::", 1))
        if arity == HELPER:
            if func is None or not func.value or "." in func.qual:
                return None
            module = self.modules.get(func.path)
            lam = f"lambda {', '.join(func.params)}: ({func.value})"
            return lam, module.consts if module else {}, keys[0]
        if (
            func is None
            or not func.value
            or len([p for p in func.params if p not in ("self", "cls")]) != arity
        ):
            return None
        module = self.modules.get(func.path)
        return func.value, module.consts if module else {}, keys[0]

    def returned_global(self, func: Func) -> str | None:
        """The module global a function of no parameters hands out itself, at every `return`
        (`def get_x(): ...; return _X`, not `return _X is not None`), read in its source."""
        parsed = parsed_source(self, func.path) if func.gives and not func.params else None
        node = function_node(parsed[0], func.line) if parsed is not None else None
        returns = [r.value for r in ast.walk(node) if isinstance(r, ast.Return)] if node is not None else []
        names = {r.id for r in returns if isinstance(r, ast.Name)}
        return (
            names.pop()
            if returns and len(names) == 1 and len(returns) == sum(map(_is_name, returns))
            else None
        )

    def stored(self, name: str) -> tuple[str, dict[str, str], str] | None:
        """What a call of the getter `name` hands out: what the one function of its module that
        rebinds the global (`global X; X = ...`) stores in it, as (expression, module constants,
        where). The setter runs at start-up, before the code that calls the getter (0.5.9's
        `get_moe_runner_backend()` is `MoeRunnerBackend(server_args.moe_runner_backend)`, stored
        by `initialize_moe_config`); the getter's own fallback (`if X is None: X = AUTO`) and a
        function that puts back what it found (`speculative_moe_backend_context`: the draft model's
        backend for the time of a `with`) aside. None when it is not such a getter, or more than one
        function stores the global."""
        if ("stored", name) not in self._settled:
            self._settled["stored", name] = self._stored(name)
        return self._settled["stored", name]

    def _stored(self, name: str) -> tuple[str, dict[str, str], str] | None:
        keys = self._by_name(name)
        getter = self.func(*keys[0].split("::", 1)) if len(keys) == 1 else None
        glob = self.returned_global(getter) if getter is not None and "." not in getter.qual else None
        module = self.modules.get(getter.path) if getter is not None else None
        if glob is None or module is None or glob not in module.rebound:
            return None
        parsed = parsed_source(self, getter.path)
        setters = [
            f
            for f in self.funcs_in(getter.path)
            if f.qual != getter.qual
            and parsed is not None
            and _rebinds(parsed[0], f, glob)
            and not _swaps(f, glob)
        ]
        if len(setters) != 1 or not setters[0].locals.get(glob):
            return None
        setter = setters[0]
        return setter.locals[glob] or "", module.consts, f"{setter.path}::{setter.qual}"

    def set_once(self, where: str, attr: str) -> tuple[str, dict[str, str], str] | None:
        """`self.<attr>` read in the method `where` (`path::Class.method`), as the class sets it:
        the one assignment, in its `__init__`, when no other method of the class or of a subclass
        and no other line of its file assigns the attribute (0.5.9's `Mxfp4MoEMethod.use_flashinfer
        = get_moe_runner_backend().is_flashinfer_mxfp4()`). As (expression, module constants,
        where); None otherwise."""
        path, _, qual = where.partition("::")
        cls, _, _ = qual.rpartition(".")
        if ("set_once", path, cls, attr) not in self._settled:
            self._settled["set_once", path, cls, attr] = self._set_once(path, cls, attr)
        return self._settled["set_once", path, cls, attr]

    def _set_once(self, path: str, cls: str, attr: str) -> tuple[str, dict[str, str], str] | None:
        key = f"self.{attr}"
        if not cls or "." in cls:
            return None
        owners = [(path, cls), *self.subclasses(cls)]
        setting = [
            f
            for p, c in owners
            for f in self.funcs_in(p)
            if f.qual.startswith(c + ".") and (key in f.locals or key in f.assigned)
        ]
        parsed = parsed_source(self, path)
        if (
            len(setting) != 1
            or setting[0].qual != f"{cls}.__init__"
            or setting[0].path != path
            or not setting[0].locals.get(key)
            or parsed is None
            or _assignments(parsed[0], attr) != 1
        ):
            return None
        module = self.modules.get(path)
        return setting[0].locals[key] or "", module.consts if module else {}, f"{path}::{setting[0].qual}"

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
        then a name defined once in the whole tree; an ambiguous name resolves to nothing. A call of
        the caller's own name is another object's method (`ModelRunner.load_model` calls
        `self.loader.load_model()`), not itself: a recursion reaches nothing new."""
        keys = [k for k in self._by_name(callee) if k != f"{caller.path}::{caller.qual}"]
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


def class_of_init(qual: str) -> str | None:
    """`Class` for `Class.__init__` (a module-level class's constructor), else None."""
    cls, _, name = qual.partition(".")
    return cls if name == "__init__" else None


def _is_name(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Name)


def _rebinds(tree: ast.Module, func: Func, name: str) -> bool:
    """Whether `func` declares `global name` (so an assignment in it rebinds the module's)."""
    node = function_node(tree, func.line)
    return node is not None and any(isinstance(n, ast.Global) and name in n.names for n in ast.walk(node))


def _swaps(func: Func, name: str) -> bool:
    """Whether `func` only swaps the global `name` for a while: its last assignment puts back a local
    that saved it (`original = X; X = other; ...; X = original`)."""
    steps = func.assigned.get(name, [])
    return len(steps) > 1 and func.locals.get(steps[-1][2]) == name


def _assignments(tree: ast.Module, attr: str) -> int:
    """Assignments to an attribute named `attr` in a file (`self.x = `, `layer.x += `, `a.x, b = `)."""
    targets: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets += node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets.append(node.target)
    flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple | ast.List) else [t])]
    return sum(isinstance(t, ast.Attribute) and t.attr == attr for t in flat)
