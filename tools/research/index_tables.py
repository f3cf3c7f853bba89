"""Tree-wide tables the index keeps beside its per-function records: attributes that hold a model
config's fact, the tree's enums, every attribute name read, and the packages every server of the
version installs. Each folds what the walker gathered per module and empties it."""

from __future__ import annotations

import re

from tools.research.index_types import ModuleFacts
from tools.research.source import SourceTree, wheel_requirements

_CONVERTED = re.compile(r"[A-Z]\w*\.\w+\(((self\.)?server_args|get_\w+\(\))\.\w+\)")
"""`Mode.from_string(server_args.x)`: one server argument converted by a class's own method (read
through an argument group's accessor from 0.5.23 on: `Mode.from_string(get_spec().x)`)."""


def config_attrs(facts: list[ModuleFacts]) -> dict[str, tuple[str, frozenset[str]]]:
    """Attributes that hold a model config's fact: `self.x = <expr>` set from a model config in one
    way across the tree (`self.is_hybrid_swa = model_config.is_hybrid_swa`, `self.use_mla_backend =
    self.model_config.attention_arch == AttentionArch.MLA`), or copied from another object's `x`
    (`self.is_hybrid_swa = model_runner.is_hybrid_swa`), or converted from one server argument by a
    class's own method (`self.spec_algorithm = SpeculativeAlgorithm.from_string(server_args.x)`, or
    `(get_spec().x)`).
    attr -> (expr, classes that set it otherwise: their `self.x` is their own). ModelConfig's own
    assignments are the facts themselves."""
    exprs: dict[str, dict[str, set[str]]] = {}
    for m in facts:
        for cls, attr, expr in m.attrs:
            if cls != "ModelConfig":
                exprs.setdefault(attr, {}).setdefault(expr, set()).add(cls)
        m.attrs = []
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for attr, by_expr in exprs.items():
        sources = [e for e in by_expr if ("model_config." in e and "(" not in e) or _CONVERTED.fullmatch(e)]
        if len(sources) != 1:
            continue
        copies = {e for e in by_expr if re.fullmatch(rf"[\w.]+\.{re.escape(attr)}", e)} - set(sources)
        others = {c for e, classes in by_expr.items() if e not in copies and e != sources[0] for c in classes}
        out[attr] = (sources[0], frozenset(others))
    return out


def computed(facts: list[ModuleFacts]) -> dict[str, str]:
    """Field -> the last name of the tree's function that computes it (`ModuleFacts.computed`), for
    fields declared once in the tree with a function of a module of the tree."""
    paths = {m.module for m in facts}
    seen: dict[str, list[str]] = {}
    for m in facts:
        for name, dotted in m.computed.items():
            module, _, func = dotted.rpartition(".")
            if module in paths:
                seen.setdefault(name, []).append(func)
        m.computed = {}
    return {name: found[0] for name, found in seen.items() if len(found) == 1}


def server_requirements(tree: SourceTree) -> frozenset[str]:
    """The packages every SGLang server of this version installs: the wheel's requirements without
    a marker or for its `srt` extra (normalized names: `flashinfer_python`)."""
    names = set()
    for line in wheel_requirements(tree):
        spec, _, marker = line.partition(";")
        if marker.strip() and marker.replace(" ", "").replace("'", '"') != 'extra=="srt"':
            continue
        if match := re.match(r"\s*([A-Za-z0-9_.-]+)", spec):
            names.add(match.group(1).lower().replace("-", "_"))
    return frozenset(names)


TORCH_CUDA = ((2, 4, "12.1"), (2, 5, "12.4"), (2, 7, "12.6"), (2, 8, "12.8"))
"""The CUDA of PyTorch's default PyPI wheel from each torch release on (a later one: at least the last)."""


def torch_cuda(tree: SourceTree) -> str | None:
    """The CUDA a server of this version runs: that of the torch its wheel pins (None: no pin)."""
    for line in wheel_requirements(tree):
        if m := re.match(r"torch==(\d+)\.(\d+)", line.replace(" ", "")):
            pin = (int(m.group(1)), int(m.group(2)))
            found = [cuda for major, minor, cuda in TORCH_CUDA if (major, minor) <= pin]
            return found[-1] if found else None
    return None


def loads(facts: list[ModuleFacts]) -> frozenset[str]:
    """Every attribute name some module of the tree reads."""
    out: set[str] = set()
    for m in facts:
        out |= m.loads
        m.loads = set()
    return frozenset(out)


def enums(facts: list[ModuleFacts]) -> dict[str, dict[str, object]]:
    """Enum class name -> members, for names defined once in the tree with constant values."""
    seen: dict[str, list[dict[str, object]]] = {}
    for m in facts:
        for name, members in m.enums.items():
            seen.setdefault(name, []).append(members)
        m.enums = {}
    return {name: found[0] for name, found in seen.items() if len(found) == 1 and found[0]}
