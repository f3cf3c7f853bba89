"""The walked facts of a tree written into a new index file (SQLite, pickled records): the tables
`FlagIndex` reads; `tools.research.index.build_index` calls it."""

from __future__ import annotations

import pickle
import sqlite3
from pathlib import Path

from tools.research import index_tables
from tools.research.catalog import FlagInfo
from tools.research.flag_index.budget import MAX_READS, Unread
from tools.research.flag_index.lookup import class_of_init
from tools.research.flag_index.serving_path import is_config_path, too_big
from tools.research.index_types import ModuleFacts, Read
from tools.research.source import SourceTree
from tools.research.walk.shapes import LOG


def write_index(
    db: Path, tree: SourceTree, catalog: list[FlagInfo], blobs: list[bytes], unread: Unread
) -> None:
    """Store the walked facts (each file's pickled `ModuleFacts`, in read order) in a new SQLite
    file at `db`. Two passes over the pickles, so that no more than one file's functions are held
    as objects at a time: the names the tree defines, then every file's records. One piece because
    both passes and the meta row write one open database, the second pass's tables becoming meta."""
    con = sqlite3.connect(db)
    con.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, data BLOB);"
        "CREATE TABLE reads (dest TEXT PRIMARY KEY, data BLOB);"
        "CREATE TABLE funcs (key TEXT PRIMARY KEY, name TEXT, data BLOB);"
        "CREATE TABLE callers (callee TEXT, caller TEXT, called INTEGER);"
        "CREATE TABLE ctors (name TEXT, key TEXT);"
    )
    ctors: list[tuple[str, str]] = []
    defined: set[str] = set()
    builders: set[str] = set()
    for blob in blobs:
        m = pickle.loads(blob)
        ctors += [(c, f"{f.path}::{f.qual}") for f in m.funcs if (c := class_of_init(f.qual))]
        defined |= {f.qual.rsplit(".", 1)[-1] for f in m.funcs} | set(m.tables)
        builders |= {f.qual.rsplit(".", 1)[-1] for f in m.funcs if any(c.callee == "cls" for c in f.calls)}
    defined |= {c for c, _ in ctors}  # a table's readers are its holdings' users
    reads: dict[str, list[Read]] = {}
    counted: dict[str, int] = {}
    registries: list[tuple[str, str, str, list[str]]] = []
    overrides: dict[str, list[tuple[str, str, int]]] = {}
    fills: dict[str, list[tuple[str, str, int]]] = {}
    callers: set[tuple[str, str, int]] = set()
    facts: list[ModuleFacts] = []
    for blob in blobs:
        m = pickle.loads(blob)
        facts.append(m)
        rows = []
        for read in m.reads:
            counted[read.dest] = counted.get(read.dest, 0) + 1
            if counted[read.dest] <= MAX_READS:
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
        "unread": unread.notes(),
        "cut": {d: (MAX_READS, n) for d, n in counted.items() if n > MAX_READS},
        "requires": index_tables.server_requirements(tree),
        "cuda": index_tables.torch_cuda(tree),
        "config_attrs": attrs,
        "enums": index_tables.enums(facts),
        "computed": index_tables.computed(facts),
        "loads": index_tables.loads(facts),
        "builders": frozenset(builders),
    }
    con.executemany("INSERT INTO meta VALUES (?, ?)", [(k, _dump(v)) for k, v in meta.items()])
    con.commit()
    con.close()


def _dump(value: object) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
