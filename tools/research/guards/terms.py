"""What a guard is evaluated with (`tools.research.guard_eval`): the values beside True, False and
UNKNOWN (a flag set to a non-default value, an enum member), the code names that are deployment
facts, the environment (`Env`), the outcome (`Outcome`), three-valued truth and comparison, and the
small syntax helpers the evaluator shares."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tools.research.platform_facts import UNKNOWN


class _NonDefault:
    """A flag set to some value other than its default (the exact value was not given)."""

    def __init__(self, default: Any):
        self.default = default

    def __repr__(self) -> str:
        return f"<not {self.default!r}>"


class Member(str):
    """A member of one of the tree's enums (`DisaggregationMode.DECODE`): equal to the same member
    only; against a raw value (`LoadFormat.AUTO == "auto"`) it is unknown, since that depends on
    the enum's mixin."""


def non_default(default: Any) -> Any:
    """The trial value of a flag whose value is not known, only that it differs from `default`."""
    return _NonDefault(default)


# Code names that are deployment facts wherever they appear as bare names or config attributes.
CODE_FACTS = {
    "topk": "model.experts_per_tok",
    "top_k": "model.experts_per_tok",
    "num_experts_per_tok": "model.experts_per_tok",
    "n_routed_experts": "model.num_experts",
    "num_experts": "model.num_experts",
    "tp_size": "server.tp_size",
    "tp_world_size": "server.tp_size",
    "gpu_mem": "gpu.memory_mib",  # `gpu_mem = get_device_memory_capacity()` (MiB) in argument code
}
SCOPES = {name: re.compile(r"moe|expert", re.IGNORECASE) for name in ("topk", "top_k")}
SCOPES["gpu_mem"] = re.compile(r"server_args|arg_groups")
"""`topk` is the MoE top-k in MoE code only (speculative decoding has a `topk` of its own);
`gpu_mem` is the GPU's memory in argument code."""
QUANT = {
    "use_int8_w8a16": ("w8a16", "int8"),
    "use_int4_w4a16": ("w4a16", "int4", "awq", "gptq"),
    "use_fp8_w8a8": ("fp8",),
}
CONFIG_FACTS = {
    "architectures": "model.architecture",  # `hf_config.architectures[0]`: the first, the one served
    "model_type": "model.model_type",
    "hidden_size": "model.hidden_size",
}
"""Model facts read as attributes of a model config only (a bare `hidden_size` is often a local)."""
CODE_ENUMS = "code.enums"
"""The tree's enum classes and their members' values (`FlagIndex.enums`), beside the facts."""
CODE_COMPUTED = "code.computed"
"""Fields a helper of the tree computes from the server args (`FlagIndex.computed`: `attn_tp_size`
-> `attn_tp_size_of`), beside the facts."""
MODEL_ENUMS = "model_config.enum_members"
MODEL_ATTRS = "model_config.self_attrs"
"""Facts beside SGLang's own ModelConfig (`model_config.<attr>`): the enum members it compares
against (`AttentionArch.MLA`) and `self.<attr>` -> the model-config expression every `self` in the
tree sets it from (`tools.research.flag_index.lookup.FlagIndex.config_attrs`)."""
SERVER_ARGS = re.compile(r"(^|\.)(server_args|args|view|cfg)$")
"""The one argument of a query function that is the server args (`attn_dp_enabled_of(view)`)."""
CONFIG_RECEIVERS = re.compile(r"(^|\.)(config|hf_config|text_config|hf_text_config|model_config)$")
"""The receivers whose attributes are a model config's (`hf_config.architectures`)."""


HELPER = -2
"""The arity `Env.queries` is asked with for a module-level helper given as a `lambda` of its
parameters (`FlagIndex.query`): the evaluator binds the call's arguments and follows its return."""
STORED = -3
"""The arity a getter of a module global is asked with: what the global's one setter stores
(`FlagIndex.stored`)."""
SET_ONCE = -4
"""The arity `self.<attr>` is asked with, as `path::Class.method#attr`: the one value the class
sets it to (`FlagIndex.set_once`)."""


@dataclass
class Env:
    """What a guard is evaluated against."""

    facts: dict[str, Any]
    flag: dict[str, Any]
    """Dest -> trial value of the flag under research (and of the flags it maps onto)."""
    dests: frozenset[str] = frozenset()
    locals: dict[str, str | None] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    """Parameter -> value evaluated in the caller (only known or flag-dependent values)."""
    consts: dict[str, str] = field(default_factory=dict)
    flag_locals: frozenset[str] = frozenset()
    where: str = ""
    """`path::function` of the code being evaluated (some code names mean a fact only in context)."""
    queries: Callable[[str, int], tuple[str, dict[str, str], str] | None] | None = None
    """A one-line query function's (returned expression, module constants, where), by name
    (`FlagIndex.query`): `uses_cutedsl()` evaluates as `get_exec().comm.backend == "cutedsl"`."""


@dataclass
class Outcome:
    """The value and why: facts used, deployment facts missing, runtime terms, flag dependence."""

    value: Any = UNKNOWN
    used: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    runtime: list[str] = field(default_factory=list)
    flag_dependent: bool = False

    @property
    def truth(self) -> bool | None:
        """True, False, or None for unknown."""
        t = truth(self.value)
        return None if t is UNKNOWN else t


def truth(value: Any) -> Any:
    """Three-valued truthiness."""
    if value is UNKNOWN:
        return UNKNOWN
    if isinstance(value, _NonDefault):
        return True if value.default in (None, False, 0, "") else UNKNOWN
    try:
        return bool(value)
    except Exception:  # noqa: BLE001 - odd objects are unknown, not an error
        return UNKNOWN


@lru_cache(maxsize=8192)
def parse_guard(source: str) -> ast.expr | None:
    """A guard's expression, parsed once per text (None: not an expression Python can parse)."""
    try:
        return ast.parse(source, mode="eval").body
    except (SyntaxError, RecursionError, MemoryError):  # the last two: nested past the parser's limits
        return None


def compare_values(left: Any, op: ast.cmpop, right: Any) -> Any:
    """`left op right` in three-valued logic: UNKNOWN when either side is, or when a non-default or
    an enum member cannot be compared with the other side."""
    if isinstance(op, ast.Is | ast.IsNot):
        if left is UNKNOWN or right is UNKNOWN:
            return UNKNOWN
        if isinstance(left, _NonDefault) or isinstance(right, _NonDefault):
            nd, other = (left, right) if isinstance(left, _NonDefault) else (right, left)
            if other is not None or nd.default is not None:
                return UNKNOWN
            same = False  # set to something other than its default None: not None
        else:
            same = left is right
        return same if isinstance(op, ast.Is) else not same
    if left is UNKNOWN or right is UNKNOWN:
        return UNKNOWN
    members = isinstance(right, tuple | frozenset) and all(isinstance(i, Member) for i in right)
    if isinstance(op, ast.In | ast.NotIn) and isinstance(left, Member) and members:
        return (left in right) == isinstance(op, ast.In)  # `self in (Mode.A, Mode.B)`
    if isinstance(left, Member) != isinstance(right, Member):
        return UNKNOWN  # a member against a raw value: equal only for some enum mixins
    if isinstance(left, _NonDefault) or isinstance(right, _NonDefault):
        nd, other = (left, right) if isinstance(left, _NonDefault) else (right, left)
        if isinstance(op, ast.Eq | ast.NotEq) and other == nd.default:
            return isinstance(op, ast.NotEq)
        return UNKNOWN
    try:
        if isinstance(op, ast.In | ast.NotIn):
            inside = left in right
            return inside if isinstance(op, ast.In) else not inside
        return {
            ast.Eq: lambda: left == right,
            ast.NotEq: lambda: left != right,
            ast.Gt: lambda: left > right,
            ast.GtE: lambda: left >= right,
            ast.Lt: lambda: left < right,
            ast.LtE: lambda: left <= right,
        }[type(op)]()
    except (TypeError, KeyError):
        return UNKNOWN


class BindParams(ast.NodeTransformer):
    """A method's parameters replaced by the expressions it is called with."""

    def __init__(self, bound: dict[str, ast.expr]):
        self.bound = bound

    def visit_Name(self, node: ast.Name) -> ast.expr:  # noqa: N802 - ast's visitor naming
        return self.bound.get(node.id, node)


def dotted_name(node: ast.expr) -> str:
    """`a.b.c` of a Name/Attribute chain (calls and subscripts give the empty string)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


_ATTRS = re.compile(r"\.(\w+)|\[['\"](\w+)['\"]\]")


def reads_a_flag(text: str, env: Env) -> bool:
    """Whether an expression reads a server arg (`server_args.x`, `cfg["x"]`)."""
    return any((a or b) in env.dests or (a or b) in env.flag for a, b in _ATTRS.findall(text))


def is_container(node: ast.expr) -> bool:
    """`[]`, `{}`, `set()`, `list(...)`: a value the code fills later, not a constant."""
    if isinstance(node, ast.List | ast.Dict | ast.Set | ast.ListComp | ast.DictComp | ast.SetComp):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("list", "dict", "set")
    )
