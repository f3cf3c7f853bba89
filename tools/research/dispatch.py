"""Dispatch context: which serving-path modules run for this deployment (issue 10, item 3).

Three sources, all read from the index, none naming a flag:

- registries: a function decorated `@register_<dest>("key")` (e.g. `@register_attention_backend
  ("triton")`) runs only when the flag `<dest>` (or a `<prefix>_<dest>` variant such as
  `decode_attention_backend`) is `key`; the modules it imports belong to that key;
- model files: `srt/models/*.py` run only for the model whose architecture class they define, and
  the model files that one imports;
- imports: a module is inactive when every import of it comes from an inactive module or from a
  branch whose guard fails here (`if server_args.enable_double_sparsity: from ... import ...`).

A module whose status cannot be decided (a missing fact) is unknown; entry points and modules
loaded dynamically (no importer) are active.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from tools.research.flag_index.lookup import FlagIndex
from tools.research.guard_eval import evaluate_all
from tools.research.guards.terms import CODE_ENUMS, MODEL_ATTRS, Env

Status = bool | None
"""True active, False inactive, None unknown."""


def _registry_status(
    index: FlagIndex, facts: dict[str, Any], dests: frozenset[str]
) -> dict[tuple[str, str], Status]:
    """(decorator, key) -> whether that registered entry is the one selected here. A setting not
    known (absent from the facts) or left to SGLang (None: `--attention-backend` unset, chosen at
    start-up from the GPU and the model) selects no entry for sure: those its phase variants name
    (`--decode-attention-backend fa3`) are selected, the others unknown."""
    out: dict[tuple[str, str], Status] = {}
    for deco, key, _path, _imports in index.registries:
        word = deco.removeprefix("register_").removeprefix("register")
        if word not in dests:
            continue
        variants = sorted(d for d in dests if d.endswith("_" + word))
        named = {str(facts[f"server.{v}"]) for v in variants if facts.get(f"server.{v}")}
        main = facts.get(f"server.{word}")
        out[(deco, key)] = key in (named | {str(main)}) or (None if main is None else False)
    return out


def registry_status(index: FlagIndex, facts: dict[str, Any]) -> dict[tuple[str, str], Status]:
    """(decorator, key) -> whether that registered entry is the one selected here (True/False/None)."""
    return _registry_status(index, facts, frozenset(f.dest for f in index.catalog))


def registry_alternatives(index: FlagIndex, facts: dict[str, Any]) -> set[str]:
    """Modules that registry entries not selected here import, and no other entry does: the classes
    they define are built only when their key is selected (`dsa_backend.py` for `--attention-backend
    dsa`), even where other modules import them for type checks or `isinstance`."""
    status = _registry_status(index, facts, frozenset(f.dest for f in index.catalog))
    off: set[str] = set()
    on: set[str] = set()
    for deco, key, _path, imports in index.registries:
        paths = {index.mod_path.get(m) for m in imports} - {None}
        (off if status.get((deco, key)) is False else on).update(paths)  # type: ignore[arg-type]
    return off - on


_PLATFORM_PARTS = ("npu", "hip", "rocm", "amd", "xpu", "cpu", "mps", "musa", "hpu", "ascend")


def _platform_status(index: FlagIndex, facts: dict[str, Any]) -> dict[str, Status]:
    """Files of another platform (`hardware_backend/npu/`, `cpu_graph_runner.py`) on a known one."""
    from tools.research.guards.terms import Outcome
    from tools.research.platform_facts import platform

    out: dict[str, Status] = {}
    for path in index.modules:
        parts = index.package_rel(path)[:-3].split("/")
        words = [p for p in parts[:-1]] + [parts[-1].split("_", 1)[0]]
        for word in words:
            if word in _PLATFORM_PARTS:
                value = platform(
                    "is_" + ("hip" if word in ("amd", "rocm") else "npu" if word == "ascend" else word),
                    facts,
                    Outcome(),
                )
                if value is False:
                    out[path] = False
                    break
    return out


def _model_status(index: FlagIndex, facts: dict[str, Any]) -> dict[str, Status]:
    """Model files: active for this architecture (and what it imports among models), else inactive."""
    models_dir = index.prefix + "srt/models/"
    files = [p for p in index.modules if p.startswith(models_dir)]
    arch = facts.get("model.architecture")
    if not arch:
        return dict.fromkeys(files)
    own = [p for p in files if arch in index.modules[p].classes]
    if not own:
        return dict.fromkeys(files)
    imports: dict[str, list[str]] = {}
    for target, src, _g, _k in index.import_graph:
        if src.startswith(models_dir) and target.startswith(models_dir):
            imports.setdefault(src, []).append(target)
    active, todo = set(own), list(own)
    while todo:
        for target in imports.get(todo.pop(), []):
            if target not in active:
                active.add(target)
                todo.append(target)
    return {p: p in active for p in files}


_STATUS_FORMAT = 2
"""Bumped when the rules change, so status files cached on disk are not reused."""
_STATUS_CACHE: dict[tuple[int, tuple], dict[str, Status]] = {}
_LAST: dict[int, tuple[dict[str, Any], dict[str, Status]]] = {}


def module_status(index: FlagIndex, facts: dict[str, Any]) -> dict[str, Status]:
    """Every module's status for these facts (True/False/None); see the module docstring.

    Kept in memory and next to the index on disk, keyed by the facts (a warm CLI call skips it)."""
    last = _LAST.get(id(index))
    if last is not None and last[0] is facts:  # why: asked per call site; the key's repr is not free
        return last[1]
    # the index's own tables are the same for every deployment of it; sets are sorted, so the key
    # is the same in every process (a set's order follows the per-process string hash)
    own = (CODE_ENUMS, MODEL_ATTRS)
    text = repr((_STATUS_FORMAT, sorted((k, _stable(v)) for k, v in facts.items() if k not in own)))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    key = (id(index), digest)
    if key in _STATUS_CACHE:
        _LAST[id(index)] = (facts, _STATUS_CACHE[key])
        return _STATUS_CACHE[key]
    path = index.db.with_name(index.db.stem + f".status-{digest}.json")
    status = _read_status(path)
    if status is None:
        status = _module_status(index, facts)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps(status))
            os.replace(tmp, path)
            _prune(index.db)
        except OSError:
            tmp.unlink(missing_ok=True)  # a read-only cache only costs the recomputation
    _STATUS_CACHE[key] = status
    _LAST[id(index)] = (facts, status)  # holds `facts`, so its id is not reused while cached
    return status


def _read_status(path: Any) -> dict[str, Status] | None:
    """A status file as JSON (data, never code: no pickle is read from the cache); None when it is
    missing or is not a mapping of module names to true, false or null."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not all(v is None or isinstance(v, bool) for v in data.values()):
        return None
    return data


def _stable(value: Any) -> str:
    """`repr` with sets and dicts in sorted order."""
    if isinstance(value, set | frozenset):
        return repr(sorted(_stable(v) for v in value))
    if isinstance(value, dict):
        return repr(sorted((_stable(k), _stable(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return repr([_stable(v) for v in value])
    return repr(value)


def _prune(db: Any, keep: int = 32) -> None:
    """Keep the newest `keep` status files of an index (one per distinct set of facts)."""
    files = sorted(db.parent.glob(db.stem + ".status-*.json"), key=lambda p: p.stat().st_mtime)
    for old in files[:-keep]:
        old.unlink(missing_ok=True)


def _module_status(index: FlagIndex, facts: dict[str, Any]) -> dict[str, Status]:
    dests = frozenset(f.dest for f in index.catalog)
    registry = _registry_status(index, facts, dests)
    status: dict[str, Status] = dict.fromkeys(index.modules, True)
    decided = {**_model_status(index, facts), **_platform_status(index, facts)}
    status.update(decided)
    fixed = set(decided)  # model and platform files: decided by the facts, not by their importers
    importers: dict[str, list[tuple[str, Status]]] = {}
    guard_memo: dict[tuple[str, tuple[str, ...]], bool | None] = {}
    for target, path, guards, keys in index.import_graph:
        edge: Status = True
        for k in keys:
            edge = registry.get(k, edge)
        if edge is not False and guards:
            if (path, guards) not in guard_memo:
                env = Env(facts=facts, flag={}, dests=dests, consts=index.modules[path].consts)
                guard_memo[(path, guards)] = evaluate_all(list(guards), env).truth
            t = guard_memo[(path, guards)]
            edge = False if t is False else (edge if t is True else None)
        importers.setdefault(target, []).append((path, edge))
    dependents: dict[str, set[str]] = {}
    for target, edges in importers.items():
        for src, _ in edges:
            dependents.setdefault(src, set()).add(target)
    todo = [t for t in importers if t not in fixed]
    while todo:
        target = todo.pop()
        new = _combine(importers[target], status)
        if new != status[target]:
            status[target] = new
            todo.extend(t for t in dependents.get(target, ()) if t not in fixed)
    return status


def _combine(edges: list[tuple[str, Status]], status: dict[str, Status]) -> Status:
    """Active if one import of it runs here, inactive if none can, else unknown."""
    unknown = False
    for src, e in edges:
        if e is True and status[src] is True:
            return True  # why: checked first and early; utils modules have hundreds of importers
        if e is not False and status[src] is not False:
            unknown = True
    return None if unknown else False


_REASONS: dict[tuple[int, int], Any] = {}


def module_reason(index: FlagIndex, facts: dict[str, Any], path: str, status: dict[str, Status]) -> str:
    """Why `path` is inactive, in words, for the evidence."""
    models_dir = index.prefix + "srt/models/"
    if path.startswith(models_dir):
        return f"a model file not used by {facts.get('model.architecture') or 'this model'}"
    key = (id(index), id(status))  # status dicts are cached per facts, so this is per facts too
    if key not in _REASONS:  # why: computed once per facts; --tp-size has hundreds of off readers
        importers: dict[str, set[str]] = {}
        for target, src, _g, _k in index.import_graph:
            importers.setdefault(target, set()).add(src)
        _REASONS[key] = (_platform_status(index, facts), importers)
    platform_off, importers = _REASONS[key]
    if path in platform_off:
        return f"code for another platform than this {facts.get('gpu.vendor') or 'NVIDIA'} GPU"
    mod = index.modules.get(path)
    name = mod.module if mod else path
    sources = sorted(importers.get(path, ()))[:3]
    return f"{name} is imported only where this deployment does not go ({', '.join(sources)})"
