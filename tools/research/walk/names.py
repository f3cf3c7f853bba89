"""How a function or a module uses a name, for the index (`walk.file`): the module-level tables
that hold classes, the names a function only tests (`x in TABLE`, `isinstance(x, Class)`), the
names module code only takes attributes of (`Class.method`). A class held in a table, named only
in a type test or only to take its attributes is not built there (`tools.research.callers`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tools.research.walk.nodes import annotation_nodes, parents, walk


def table_of(st: ast.stmt) -> tuple[str, list[str]] | None:
    """`NAME = {"key": Class, ...}` (or a list, tuple or set) of constants and names only: the
    table's name and the names it holds (None for any other statement)."""
    if not isinstance(st, ast.Assign | ast.AnnAssign) or st.value is None:
        return None
    targets = st.targets if isinstance(st, ast.Assign) else [st.target]
    value = st.value
    if len(targets) != 1 or not isinstance(targets[0], ast.Name):
        return None
    if isinstance(value, ast.Dict):  # `{**OTHER_TABLE, "key": Class}`: a None key unpacks
        items = [*(k for k in value.keys if k is not None), *value.values]
    elif isinstance(value, ast.List | ast.Tuple | ast.Set):
        items = list(value.elts)
    else:
        return None
    if not items or not all(isinstance(i, ast.Constant | ast.Name | ast.Attribute) for i in items):
        return None
    names = [
        n
        for i in items
        if not isinstance(i, ast.Constant)
        for n in dict.fromkeys((ast.unparse(i).split(".")[0], ast.unparse(i).rsplit(".", 1)[-1]))
    ]
    return (targets[0].id, names) if names else None


def _loads(st: ast.AST) -> Iterator[tuple[ast.Name, ast.AST | None, dict[ast.AST, ast.AST]]]:
    """(name, its parent, the parent map) for every name `st` loads outside type annotations."""
    parent = parents(st)
    hidden = annotation_nodes(st)
    for node in walk(st):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node not in hidden:
            yield node, parent.get(node), parent


def _member(node: ast.AST, up: ast.AST | None) -> bool:
    """`x in NODE` / `x not in NODE`."""
    return isinstance(up, ast.Compare) and any(
        c is node and isinstance(op, ast.In | ast.NotIn) for op, c in zip(up.ops, up.comparators, strict=True)
    )


def tested_only(st: ast.AST) -> list[str]:
    """Names whose every load in `st` is a membership test: `x in NAME`, `x not in NAME`,
    `NAME.keys()`."""
    tested: set[str] = set()
    other: set[str] = set()
    for node, up, parent in _loads(st):
        keys = isinstance(up, ast.Attribute) and up.attr == "keys" and isinstance(parent.get(up), ast.Call)
        (tested if _member(node, up) or keys else other).add(node.id)
    return sorted(tested - other)


def typed_only(st: ast.AST) -> tuple[list[str], list[str]]:
    """Names whose every load in `st` is the class an `isinstance`/`issubclass` test names
    (`isinstance(x, Name)`, `isinstance(x, (Name, Other))`, `type(x) is Name`, or put into a list
    only such a test reads, `_type_lists`): they build nothing there; and names
    whose every load is such a test or the holder of an attribute taken (`Name.is_applicable(kvc)`,
    `fn = Name.forward`, at least once): they build the class only through a classmethod that
    builds it. A call of the name itself (`Name(...)`) is a call edge, counted apart."""
    typed: set[str] = set()
    called: set[str] = set()
    other: set[str] = set()
    lists = _type_lists(st)
    for node, up, parent in _loads(st):
        if isinstance(up, ast.Call) and up.func is node:
            continue  # `Name(...)`: a call edge of its own
        receiver = isinstance(up, ast.Attribute) and up.value is node
        listed = _listed(node, up, parent, lists)
        up = parent.get(up) if isinstance(up, ast.Tuple) else up
        test = listed or _type_test(node, up) or _type_compared(node, up)
        (typed if test else called if receiver else other).add(node.id)
    return sorted(typed - other - called), sorted(called - other)


def _type_test(node: ast.AST, up: ast.AST | None) -> bool:
    """`isinstance(x, NODE)`, `issubclass(c, NODE)`, NODE one of a tuple of classes there."""
    return (
        isinstance(up, ast.Call)
        and isinstance(up.func, ast.Name)
        and up.func.id in ("isinstance", "issubclass")
        and len(up.args) == 2
        and (up.args[1] is node or node in getattr(up.args[1], "elts", ()))
    )


_GROWS = ("append", "extend", "insert")


def _type_lists(st: ast.AST) -> set[str]:
    """Locals of `st` that hold classes only for a type test: assigned list or tuple literals only,
    loaded only to grow them (`L.append(C)`) or as the classes of an `isinstance` test (`L`,
    `tuple(L)`): 0.5.23's `graph_supported_backend_types` in `EagleDraftWorker._capture_cuda_graphs`."""
    parent = parents(st)
    literal: set[str] = set()
    other: set[str] = set()
    for node in walk(st):
        if not isinstance(node, ast.Name):
            continue
        up = parent.get(node)
        if isinstance(node.ctx, ast.Store):
            assigned = isinstance(up, ast.Assign) and len(up.targets) == 1
            (literal if assigned and isinstance(up.value, ast.List | ast.Tuple) else other).add(node.id)
            continue
        grows = isinstance(up, ast.Attribute) and up.attr in _GROWS and isinstance(parent.get(up), ast.Call)
        call = parent.get(up) if isinstance(up, ast.Call) else None
        as_tuple = isinstance(up, ast.Call) and isinstance(up.func, ast.Name) and up.func.id == "tuple"
        tested = _type_test(node, up) or (as_tuple and len(up.args) == 1 and _type_test(up, call))  # type: ignore[union-attr]
        if not (grows or tested):
            other.add(node.id)
    return literal - other


def _listed(node: ast.Name, up: ast.AST | None, parent: dict[ast.AST, ast.AST], lists: set[str]) -> bool:
    """Whether `node` is put into one of the type lists `lists`: an element of the literal assigned
    to it, or an argument of its `append`/`extend`/`insert`."""
    if isinstance(up, ast.List | ast.Tuple):
        assign = parent.get(up)
        return isinstance(assign, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in lists for t in assign.targets
        )
    if isinstance(up, ast.Call) and node in up.args and isinstance(up.func, ast.Attribute):
        holder = up.func.value
        return up.func.attr in _GROWS and isinstance(holder, ast.Name) and holder.id in lists
    return False


def _type_compared(node: ast.AST, up: ast.AST | None) -> bool:
    """`type(x) is NODE` (or `is not`, `==`, `!=`, either side): an exact type test, which builds
    nothing (`type(method) is Fp8LinearMethod` in an activation that fuses an FP8 linear's input)."""
    if not (isinstance(up, ast.Compare) and len(up.ops) == 1):
        return False
    if not isinstance(up.ops[0], ast.Is | ast.IsNot | ast.Eq | ast.NotEq):
        return False
    sides = [up.left, up.comparators[0]]
    other = sides[1] if sides[0] is node else sides[0] if sides[1] is node else None
    return (
        isinstance(other, ast.Call)
        and isinstance(other.func, ast.Name)
        and other.func.id == "type"
        and len(other.args) == 1
    )


def attribute_holders(body: list[ast.stmt]) -> dict[str, list[str]]:
    """Names module-level code, class bodies included, loads only to take an attribute of them ->
    those attributes (`forward = DeepseekV4AttnBackend.forward` in another backend's class body):
    the class is not built there, unless one of them is a method that builds it (`cls(...)`).
    A class's bases are followed as subclasses (`FlagIndex.subclasses`), not counted here."""
    roots: list[ast.AST] = []
    todo = list(body)
    while todo:
        st = todo.pop()
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(st, ast.ClassDef):
            roots += st.decorator_list
            todo += st.body
        else:
            roots.append(st)
    attrs: dict[str, set[str]] = {}
    other: set[str] = set()
    for root in roots:
        for node, up, _ in _loads(root):
            if isinstance(up, ast.Attribute) and up.value is node:
                attrs.setdefault(node.id, set()).add(up.attr)
            else:
                other.add(node.id)
    return {name: sorted(a) for name, a in attrs.items() if name not in other}


def table_entries(st: ast.AST) -> dict[str, list[tuple[str, tuple[str, ...], int]]]:
    """Names (a function, `self.method`) whose every use in `st` other than a call is as a value of
    a dict literal with string keys -> (its key, all the dict's keys, the line) per use:
    `{"triton": self._create_triton_backend, "dsv4": self._create_dsv4_backend}[backend]()` runs
    the entry its key selects (`tools.research.callers` asks a registry of those keys)."""
    parent = parents(st)
    entries: dict[str, list[tuple[str, tuple[str, ...], int]]] = {}
    other: set[str] = set()
    for node in walk(st):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            name = node.id
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            name = node.attr
        else:
            continue
        up = parent.get(node)
        if isinstance(up, ast.Call) and up.func is node or isinstance(up, ast.Attribute):
            continue  # a call (an edge of its own), or the holder of an attribute
        keys = _string_keys(up) if isinstance(up, ast.Dict) else None
        if keys is None or node not in up.values:  # type: ignore[union-attr]
            other.add(name)
            continue
        key = keys[up.values.index(node)]  # type: ignore[union-attr]
        entries.setdefault(name, []).append((key, keys, node.lineno))
    return {name: e for name, e in entries.items() if name not in other}


def _string_keys(table: ast.Dict) -> tuple[str, ...] | None:
    """The keys of a dict literal whose every key is a string constant, in order; else None."""
    keys = [k.value if isinstance(k, ast.Constant) and isinstance(k.value, str) else None for k in table.keys]
    return None if not keys or None in keys else tuple(keys)  # type: ignore[return-value]


_NOT_BUILT_BY_NAME = ("Enum", "NamedTuple", "TypedDict", "Protocol", "ABC", "Exception", "Error")
"""Bases whose subclasses are not (only) built by calls of their name: enum members exist without a
call, typing constructs are never built, an exception is raised (its construction is no reach)."""


def implicit_init(cls: ast.ClassDef) -> bool:
    """Whether a class gets an implicit `__init__` in the index: a plain subclass (`class
    _ModelOptFp4OnlineConfig(NvFp4OnlineConfig):` with classmethods only) has no `__init__` of its
    own, yet it is built by calls of its name like any class; recorded so, its construction is
    followed, and so is its base's through it. Not for a decorated class (a decorator may register
    or rebuild it) nor for bases that are not built by name (`_NOT_BUILT_BY_NAME`)."""
    if not cls.bases or cls.decorator_list or cls.keywords:
        return False
    if any(any(word in ast.unparse(b) for word in _NOT_BUILT_BY_NAME) for b in cls.bases):
        return False
    return not any(
        isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name in ("__init__", "__new__")
        for s in cls.body
    )


_FILLS = frozenset({"update", "setdefault", "append", "extend", "add", "insert"})


def loose_names(body: list[ast.stmt]) -> list[str]:
    """Names module-level code loads other than to fill a table in (`T.update(...)`, `T[k] = v`)
    or inside a table literal (`table_of`): a table used that way may hand out what it holds."""
    out: set[str] = set()
    todo = list(body)
    while todo:
        st = todo.pop()
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) or table_of(st) is not None:
            continue
        parent = parents(st)
        for node in walk(st):
            if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
                continue
            up = parent.get(node)
            fill = (
                isinstance(up, ast.Attribute) and up.attr in _FILLS and isinstance(parent.get(up), ast.Call)
            )
            stored = isinstance(up, ast.Subscript) and isinstance(up.ctx, ast.Store)
            if not (fill or stored):
                out.add(node.id)
    return sorted(out)


KEYS = "<keys>"
"""A `probed_tables` use that takes only a table's keys (`[*TABLE]`, `list(TABLE)`): nothing is built
from a dict table read that way."""


def probed_tables(st: ast.AST) -> dict[str, list[str]]:
    """Names of tables `st` reads only to call methods on their entries -> those methods:
    `for _, m in TABLE.items(): m.override_quantization_method(cfg)`, `TABLE[k].probe(x)`; a key
    loop, a membership test or `[*TABLE]` (`KEYS`) takes no entry. A table read any other way
    (`return TABLE[name]`) is not listed: what it hands out may be built."""
    parent = parents(st)
    bound: dict[str, str] = {}  # loop variable -> the table whose entries it holds
    uses: dict[str, list[str]] = {}
    other: set[str] = set()
    for node in walk(st):
        if isinstance(node, ast.For):
            table, entry = _entry_loop(node)
            if table is not None:
                uses.setdefault(table, [])
                if entry is not None:
                    bound[entry] = table
    for node, up, _ in _loads(st):
        if node.id in bound:  # an entry: only `entry.method(...)`
            call = parent.get(up) if isinstance(up, ast.Attribute) else None
            if isinstance(call, ast.Call) and call.func is up:
                uses.setdefault(bound[node.id], []).append(up.attr)  # type: ignore[union-attr]
            else:
                other.add(bound[node.id])
            continue
        use = _table_use(node, up, parent)
        if use is None:
            other.add(node.id)
        elif use:
            uses.setdefault(node.id, []).append(use)
    return {t: sorted(set(m)) for t, m in uses.items() if t not in other and t not in bound}


def _entry_loop(loop: ast.For) -> tuple[str | None, str | None]:
    """(table, the loop variable holding its entries or None) of `for k, v in TABLE.items()`,
    `for v in TABLE.values()`, `for k in TABLE.keys()`; (None, None) for any other loop."""
    it = loop.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and not it.args):
        return None, None
    if not isinstance(it.func.value, ast.Name):
        return None, None
    table, how, target = it.func.value.id, it.func.attr, loop.target
    if how == "keys":
        return table, None
    if how == "values" and isinstance(target, ast.Name):
        return table, target.id
    if how == "items" and isinstance(target, ast.Tuple) and len(target.elts) == 2:
        value = target.elts[1]
        return (table, value.id) if isinstance(value, ast.Name) else (None, None)
    return None, None


def _table_use(node: ast.Name, up: ast.AST | None, parent: dict[ast.AST, ast.AST]) -> str | None:
    """How a load of a possible table takes from it: "" for no entry (the iterable of an entry loop,
    a membership test), `KEYS` for its keys only, the method called for `TABLE[k].method(...)`;
    None for any other use."""
    if isinstance(up, ast.Attribute) and up.attr in ("items", "values", "keys"):
        loop = parent.get(parent.get(up))  # type: ignore[arg-type]
        return "" if isinstance(loop, ast.For) and _entry_loop(loop)[0] == node.id else None
    if _member(node, up):
        return ""
    if isinstance(up, ast.Starred) or (
        isinstance(up, ast.Call) and isinstance(up.func, ast.Name) and up.func.id in ("list", "sorted", "set")
    ):
        return KEYS
    if isinstance(up, ast.Subscript) and up.value is node:
        attr = parent.get(up)
        call = parent.get(attr) if isinstance(attr, ast.Attribute) else None
        if isinstance(call, ast.Call) and call.func is attr:
            return attr.attr  # type: ignore[union-attr]
    return None
