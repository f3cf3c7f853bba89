"""The `launch_server` flag catalog of an SGLang tree, read with `ast` (never imported, never run).

Two eras: up to ~0.5.9 every flag is a `parser.add_argument(...)` call in `srt/server_args.py`
(defaults often `ServerArgs.x`, resolved from the dataclass); later versions declare most flags as
annotated fields `name: A[type, "help" | Arg(...)] = default` in `srt/arg_groups/fields/*.py`, with a
few manual `add_argument` calls (deprecated spellings, dynamic choices) left in `server_args.py`.
`parse_help_text` reads `--help` output, the authoritative catalog when the target can run it.

`parse_help_text` and `catalog_from_host` are in `scan/help_text.py`, the `ast` value readers in
`scan/ast_values.py`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from tools.flagname import flag_dest, flag_name
from tools.research.scan.ast_values import (
    ParsedModule,
    as_list,
    dataclass_defaults,
    literal_value,
    node_text,
    unwrap_type,
)
from tools.research.source import SourceTree

# Only a help text that *starts* by saying so marks a flag deprecated ("Deprecated. Use ...",
# "(Deprecated: use ...)", "Note: --x is deprecated now."); "replaces the deprecated --y" does not.
_DEPRECATED_RE = re.compile(r"^\W*(?:note:\s*)?(?:--[\w-]+\s+is\s+)?deprecated\b", re.IGNORECASE)
_REPLACEMENT_RE = re.compile(r"\buse\s+`?(--[\w{},-]+(?:=\S+|\s+<[^>]+>)?)", re.IGNORECASE)


@dataclass
class FlagInfo:
    """One server flag: `name` is `--flag`, `dest` the attribute the code reads, `path:line` its definition."""

    name: str
    dest: str
    type: str | None = None
    default: Any = None
    choices: list[Any] | None = None
    help: str = ""
    deprecated: bool = False
    replacement: str | None = None
    path: str | None = None
    line: int | None = None
    aliases: list[str] = field(default_factory=list)
    namespace: str | None = None
    """The config namespace of a field-declared flag (`exec.moe` → `get_exec().moe.<dest>`)."""
    negatable: bool = False
    """A `BooleanOptionalAction` flag: `--no-<name>` is accepted too and sets it False."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def deprecation_of(help_text: str, action: str | None, new_flag: Any) -> tuple[bool, str | None]:
    """(deprecated, replacement) of a flag from its help text, its argparse `action` and a declared
    `new_flag`; the replacement is `new_flag`, else the `--flag` the help text says to use."""
    deprecated = bool(action and "Deprecated" in action) or bool(_DEPRECATED_RE.search(help_text))
    if not deprecated:
        return False, None
    if isinstance(new_flag, str):
        return True, new_flag
    m = _REPLACEMENT_RE.search(help_text)
    return True, m.group(1).rstrip(".,)`") if m else None


def _argparse_flags(mod: ParsedModule, field_defaults: dict[str, Any]) -> list[FlagInfo]:
    """Every `*.add_argument("--x", ...)` call in a module. One piece because it is one walk of the
    tree, each call read keyword by keyword (dest, default, type, help) into one `FlagInfo`."""
    flags = []
    for node in ast.walk(mod.node):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        longs = [n for n in names if n.startswith("--")]
        if not longs:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = literal_value(kw.get("action")) if "action" in kw else None
        action = action if isinstance(action, str) else None
        dest = literal_value(kw["dest"]) if "dest" in kw else _implicit_dest(longs, field_defaults)
        if "default" in kw:
            default_node = kw["default"]
            if isinstance(default_node, ast.Attribute) and default_node.attr in field_defaults:
                default = field_defaults[default_node.attr]
            elif isinstance(default_node, ast.Call) and node_text(default_node.func) == "_declared_default":
                default = field_defaults.get(literal_value(default_node.args[0]) if default_node.args else "")
            else:
                default = literal_value(default_node, mod.constants)
        elif action in ("store_true", "BooleanOptionalAction") or (action or "").endswith("StoreTrueAction"):
            default = field_defaults.get(dest, False)
        else:
            default = field_defaults.get(dest)
        if (
            action
            and ("store_true" in action.lower() or "store_false" in action.lower())
            or action
            and "BooleanOptional" in action
        ):
            type_name = "bool"
        elif "type" in kw:
            type_name = node_text(kw["type"])
        else:
            type_name = "str" if not action else None
        help_text = literal_value(kw.get("help"), mod.constants) or ""
        choices = literal_value(kw["choices"], mod.constants) if "choices" in kw else None
        deprecated, replacement = deprecation_of(str(help_text), action, literal_value(kw.get("new_flag")))
        flags.append(
            FlagInfo(
                name=longs[0],
                dest=str(dest),
                type=type_name,
                default=default,
                choices=as_list(choices),
                help=str(help_text),
                deprecated=deprecated,
                replacement=replacement,
                path=mod.rel,
                line=node.lineno,
                aliases=[n for n in names if n != longs[0]],
                negatable="BooleanOptional" in (action or ""),
            )
        )
    return flags


def _implicit_dest(longs: list[str], fields: dict[str, Any]) -> str:
    """argparse's dest (first long option), unless only an alias names a field (`--tp-size` → tp_size)."""
    candidates = [n[2:].replace("-", "_") for n in longs]
    return next((c for c in candidates if c in fields), candidates[0])


def _field_flags(mod: ParsedModule, names: dict[str, ast.expr]) -> list[FlagInfo]:
    """Annotated fields `x: A[type, "help" | Arg(...)] = default` of every class in a module.
    One piece because it is one walk of the classes, each field read part by part into one `FlagInfo`."""
    flags = []
    for cls in ast.walk(mod.node):
        if not isinstance(cls, ast.ClassDef):
            continue
        namespace = None
        for stmt in cls.body:
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_NS_PATH" for t in stmt.targets
            ):
                namespace = literal_value(stmt.value)
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            ann = stmt.annotation
            if not (
                isinstance(ann, ast.Subscript)
                and node_text(ann.value) in ("A", "Annotated", "typing.Annotated")
                and isinstance(ann.slice, ast.Tuple)
                and len(ann.slice.elts) >= 2
            ):
                continue
            type_node, meta = ann.slice.elts[0], ann.slice.elts[1]
            kw: dict[str, ast.expr] = {}
            if isinstance(meta, ast.Call) and node_text(meta.func) == "Arg":
                kw = {k.arg: k.value for k in meta.keywords if k.arg}
                help_text = literal_value(kw.get("help"), names) or ""
            elif isinstance(meta, ast.Constant | ast.JoinedStr | ast.BinOp):
                help_text = literal_value(meta, names)
            else:
                continue
            if literal_value(kw.get("no_cli")) is True:
                continue
            dest = stmt.target.id
            type_name, literal_choices = unwrap_type(type_node)
            action = node_text(kw["action"]) if "action" in kw else None
            if type_name == "bool" and action is None:
                action = "store_true"
            cli = literal_value(kw.get("cli_name")) if "cli_name" in kw else None
            deprecated, replacement = deprecation_of(str(help_text), action, None)
            flags.append(
                FlagInfo(
                    name=cli if isinstance(cli, str) else "--" + dest.replace("_", "-"),
                    dest=dest,
                    type="bool" if action and "store" in action and type_name == "bool" else type_name,
                    default=literal_value(stmt.value, names) if stmt.value is not None else None,
                    choices=as_list(literal_value(kw["choices"], names))
                    if "choices" in kw
                    else literal_choices,
                    help=str(help_text),
                    deprecated=deprecated,
                    replacement=replacement,
                    path=mod.rel,
                    line=stmt.lineno,
                    aliases=[a for a in (literal_value(kw.get("aliases")) or []) if isinstance(a, str)],
                    namespace=namespace if isinstance(namespace, str) else None,
                    negatable="BooleanOptional" in (action or ""),
                )
            )
    return flags


def flag_catalog(tree: SourceTree) -> list[FlagInfo]:
    """Every `launch_server` flag of the tree, in declaration order (fields first, then `add_argument`)."""
    return [FlagInfo(**asdict(f)) for f in _catalog_cached(tree.package_dir.resolve(), tree.root.resolve())]


@lru_cache(maxsize=8)
def _catalog_cached(package_dir: Path, root: Path) -> tuple[FlagInfo, ...]:
    tree = SourceTree(root, package_dir, "", "")
    server_args = package_dir / "srt" / "server_args.py"
    if not server_args.is_file():
        raise FileNotFoundError(f"{tree.rel(server_args)}: not in this tree; is it an SGLang source?")
    field_files = sorted((package_dir / "srt" / "arg_groups" / "fields").glob("*.py"))
    field_modules = [ParsedModule(tree, p) for p in field_files]
    choices_file = package_dir / "srt" / "arg_groups" / "choices.py"
    shared: dict[str, ast.expr] = {}
    if choices_file.is_file():
        shared.update(ParsedModule(tree, choices_file).constants)
    flags: list[FlagInfo] = []
    for mod in field_modules:
        flags.extend(_field_flags(mod, {**shared, **mod.constants}))
    main = ParsedModule(tree, server_args)
    main.constants = {**shared, **main.constants}
    defaults = dataclass_defaults(main, "ServerArgs")
    for f in flags:
        defaults.setdefault(f.dest, f.default)
    flags.extend(_field_flags(main, main.constants))
    seen = {f.name for f in flags}
    for f in _argparse_flags(main, defaults):
        if f.name in seen:
            flags = [g for g in flags if g.name != f.name]
        seen.add(f.name)
        flags.append(f)
    return tuple(flags)


def find_flag(catalog: list[FlagInfo], flag: str) -> FlagInfo | None:
    """The catalog entry for `flag` (`--x-y`, `x-y` or `x_y`; aliases count too; `--no-x` finds a
    negatable boolean `--x`, see `negated`)."""
    name, dest = flag_name(flag), flag_dest(flag)
    for f in catalog:
        if f.name == name or name in f.aliases:
            return f
    found = next((f for f in catalog if f.dest == dest), None)
    if found is None and name.startswith("--no-"):
        base = find_flag(catalog, name[5:])
        if base is not None and (base.negatable or "--no-" + base.name[2:] in base.aliases):
            return base
    return found


def negated(info: FlagInfo, flag: str) -> bool:
    """Whether `flag` is the `--no-` spelling of the boolean `info` (so it sets it False)."""
    name = flag_name(flag)
    return name.startswith("--no-") and name != info.name and name[5:] == info.name[2:]
