"""The evaluator of one guard expression (`Evaluator`), node by node, in Kleene logic (see
`tools.research.guard_eval`)."""

from __future__ import annotations

import ast
import copy
import operator
from typing import Any

from tools.research.guards.follow import Follower
from tools.research.guards.terms import (
    CODE_COMPUTED,
    CODE_ENUMS,
    CODE_FACTS,
    CONFIG_FACTS,
    CONFIG_RECEIVERS,
    MODEL_ATTRS,
    MODEL_ENUMS,
    QUANT,
    SCOPES,
    SERVER_ARGS,
    BindParams,
    Env,
    Member,
    Outcome,
    compare_values,
    dotted_name,
    is_container,
    parse_guard,
    reads_a_flag,
    truth,
)
from tools.research.platform_facts import UNKNOWN, platform

_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_STR_METHODS = frozenset({"lower", "upper", "strip"})
"""String methods without arguments evaluated on a known string."""


MAX_STEPS = 2_000
"""Nodes one guard's evaluation visits, with the locals, constants and queries it follows. The most
any guard of SGLang 0.5.23 takes is 117 (each of its flags researched on the story's GPUs); locals
that name the last one twice (`b = a + a`, `c = b + b`, ...) double it at each step, so past this
the guard is unknown (`TooLarge`)."""


class TooLarge(Exception):
    """A guard whose evaluation visits more than `MAX_STEPS` nodes."""


class Evaluator(Follower):
    """Evaluates one guard expression against `env` (`.ev(node, depth)`), noting in `out` what it
    used, what was missing and what is runtime state; `steps` is shared with the evaluations it starts."""

    def __init__(self, env: Env, out: Outcome, steps: list[int] | None = None):
        self.env, self.out = env, out
        self.steps = [MAX_STEPS] if steps is None else steps
        """Nodes left to visit, shared with the evaluators of the locals and queries it follows."""

    def fact(self, key: str) -> Any:
        if key in self.env.facts:
            self.out.used.append(f"{key} = {self.env.facts[key]!r}")
            return self.env.facts[key]
        self.out.missing.append(key)
        return UNKNOWN

    def model_config(self, node: ast.Attribute, depth: int) -> Any:
        """`model_config.x` / `self.model_config.x` from SGLang's own ModelConfig, `self.x` where the
        tree sets it from one (`self.use_mla_backend`), an enum member it compares with; else UNKNOWN."""
        facts = self.env.facts
        if MODEL_ATTRS not in facts:
            return UNKNOWN  # the ModelConfig was not built for this deployment
        receiver = dotted_name(node.value)
        key = f"model_config.{node.attr}"
        if key in facts and (receiver == "model_config" or receiver.endswith(".model_config")):
            return self.fact(key)
        if receiver and (entry := facts[MODEL_ATTRS].get(node.attr)) and depth < 5:
            text, own = entry
            if receiver == "self":  # unless this class sets it its own way
                sub = (
                    parse_guard(text)
                    if self.env.where.partition("::")[2].partition(".")[0] not in own
                    else None
                )
            else:  # another object's copy: only of the model config's own attribute (`kvc.is_hybrid_swa`)
                sub = parse_guard(text) if text.endswith(f"model_config.{node.attr}") else None
            return UNKNOWN if sub is None else self.ev(sub, depth + 1)
        if f"{receiver}.{node.attr}" in facts.get(MODEL_ENUMS, ()):
            return f"{receiver}.{node.attr}"
        return UNKNOWN

    def dest(self, name: str) -> Any:
        if name in self.env.flag:
            self.out.flag_dependent = True
            return self.env.flag[name]
        if name == "device" and "server.device" not in self.env.facts and "gpu.sm" in self.env.facts:
            # an NVIDIA GPU (it has an SM version) resolves the device to CUDA (`device == "mps"`)
            self.out.used.append(f"gpu.sm = {self.env.facts['gpu.sm']} (device cuda)")
            return "cuda"
        return self.fact(f"server.{name}")

    def named(self, name: str, depth: int) -> Any:
        env = self.env
        if name in env.params:
            if name in env.flag_locals:
                self.out.flag_dependent = True
            return env.params[name]
        if name in env.flag_locals and env.locals.get(name):
            self.out.flag_dependent = True
        value = platform(name, env.facts, self.out)
        if value is not None:
            return value
        local = env.locals.get(name)
        scope = SCOPES.get(name)
        in_scope = scope is None or bool(scope.search(env.where))
        if name in CODE_FACTS and in_scope and not (local and reads_a_flag(local, env)):
            # `topk = topk_ids.shape[1]` is the MoE top-k; `topk = server_args.speculative_eagle_topk`
            # is another flag's value and is followed as a local below
            return self.fact(CODE_FACTS[name])
        if not (local and reads_a_flag(local, env)) and (size := self.size_named(name, depth)) is not None:
            return size
        if name in QUANT:
            q = self.fact("model.quantization")
            return q if q is UNKNOWN else any(s in str(q or "").lower() for s in QUANT[name])
        for table in (env.locals, env.consts):
            text = table.get(name)
            if text and depth < 5 and (sub := parse_guard(text)) is not None and not is_container(sub):
                return self.ev(sub, depth + 1)
        self.out.runtime.append(name)
        return UNKNOWN

    def ev(self, node: ast.expr, depth: int) -> Any:  # noqa: C901, PLR0911, PLR0912 - one case per node type
        """The value of `node` on this deployment, or UNKNOWN. One piece because it is one dispatch,
        one case per node type, that charges the step budget once per node it evaluates."""
        self.steps[0] -= 1
        if self.steps[0] < 0:
            raise TooLarge
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.named(node.id, depth)
        if isinstance(node, ast.Attribute):
            if node.attr in self.env.flag or node.attr in self.env.dests:
                return self.dest(node.attr)
            value = platform(node.attr, self.env.facts, self.out)
            if value is not None:
                return value
            if node.attr in CODE_FACTS and CONFIG_RECEIVERS.search(dotted_name(node.value)):
                return self.fact(CODE_FACTS[node.attr])
            if node.attr in CONFIG_FACTS and CONFIG_RECEIVERS.search(dotted_name(node.value)):
                value = self.fact(CONFIG_FACTS[node.attr])
                return (value,) if node.attr == "architectures" and value is not UNKNOWN else value
            if (model := self.model_config(node, depth)) is not UNKNOWN:
                return model
            if (helper := self.env.facts.get(CODE_COMPUTED, {}).get(node.attr)) is not None:
                # a field its declaration names the helper of (`get_parallel().attn_tp_size`)
                call = ast.Call(ast.Name(helper, ast.Load()), [ast.Name("server_args", ast.Load())], [])
                if (value := self.followed(Follower.helper_value, call, depth)) is not UNKNOWN:
                    return value
            if (
                node.attr == "world_size"
                and (size := self.followed(Follower.group_size, node.value, depth)) is not UNKNOWN
            ):
                return size
            if node.attr.endswith(("world_size", "tp_size")):
                receiver = " ".join(ast.unparse(node.value).split())
                if (size := self.world(node.attr, self.out, receiver)) is not None:
                    return size
            receiver = dotted_name(node.value)
            if receiver == "self" and (text := self.env.locals.get(f"self.{node.attr}")) and depth < 5:
                sub = parse_guard(text)  # `self.mode = Mode(cfg.x)` earlier in this function
                if sub is not None and not is_container(sub):
                    return self.ev(sub, depth + 1)
            if node.attr in self.env.facts.get(CODE_ENUMS, {}).get(receiver, {}):
                return Member(f"{receiver}.{node.attr}")  # `DisaggregationMode.DECODE`
            if receiver == "self" and (value := self.followed(Follower.set_once, node, depth)) is not UNKNOWN:
                return value  # `self.use_flashinfer`, set once in `__init__`
            self.out.runtime.append("." + node.attr)  # why: ast.unparse here dominated the cost
            return UNKNOWN
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
            if isinstance(key, str) and (key in self.env.flag or key in self.env.dests):
                return self.dest(key)
            if isinstance(key, str) and isinstance(node.value, ast.Call):  # `widths_of(cfg)["attn_tp_size"]`
                return self.followed(Follower.entry, node.value, depth, key=key)
            if isinstance(key, int) and not isinstance(key, bool):  # `get_device_capability()[0]`
                seq = self.ev(node.value, depth)
                return seq[key] if isinstance(seq, tuple) and -len(seq) <= key < len(seq) else UNKNOWN
            return UNKNOWN
        if isinstance(node, ast.Call):
            return self.call(node, depth)
        if isinstance(node, ast.BoolOp):
            return self.boolop(node, depth)
        if isinstance(node, ast.UnaryOp):
            value = self.ev(node.operand, depth)
            if isinstance(node.op, ast.Not):
                t = truth(value)
                return UNKNOWN if t is UNKNOWN else not t
            if isinstance(node.op, ast.USub) and isinstance(value, int | float):
                return -value
            return UNKNOWN
        if isinstance(node, ast.Compare):
            return self.compare(node, depth)
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = [self.ev(e, depth) for e in node.elts]
            return UNKNOWN if any(i is UNKNOWN for i in items) else tuple(items)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            left, right = self.ev(node.left, depth), self.ev(node.right, depth)
            numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (left, right))
            if not numbers or (isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0):
                return UNKNOWN
            return _ARITHMETIC[type(node.op)](left, right)  # `gpu_mem < 20 * 1024`
        if isinstance(node, ast.IfExp):
            t = truth(self.ev(node.test, depth))
            if t is UNKNOWN:
                return UNKNOWN
            return self.ev(node.body if t else node.orelse, depth)
        return UNKNOWN

    def call(self, node: ast.Call, depth: int) -> Any:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("getattr", "get") and node.args:
            key = node.args[1] if name == "getattr" and len(node.args) > 1 else node.args[0]
            known = isinstance(key, ast.Constant) and isinstance(key.value, str)
            if known and (key.value in self.env.flag or key.value in self.env.dests):
                return self.dest(key.value)
            if known and name == "getattr" and key.value in CONFIG_FACTS:  # getattr(hf_config, "x", d)
                return self.ev(ast.Attribute(node.args[0], key.value, ast.Load()), depth)
            if known and name == "getattr" and f"model_config.{key.value}" in self.env.facts:
                return self.model_config(ast.Attribute(node.args[0], key.value, ast.Load()), depth)
        members = self.env.facts.get(CODE_ENUMS, {}).get(dotted_name(func))
        if members and len(node.args) == 1 and not node.keywords:  # `Mode(cfg.x)`: the member of that value
            value = self.ev(node.args[0], depth)
            found = [k for k, v in members.items() if v == value and value is not UNKNOWN]
            return Member(f"{dotted_name(func)}.{found[0]}") if found else UNKNOWN
        if name == "get_device_capability":
            sm = self.fact("gpu.sm")
            return UNKNOWN if sm is UNKNOWN else (sm // 10, sm % 10)
        if name in ("get_device_sm", "get_sm_version"):
            return self.fact("gpu.sm")
        if name == "get_device_name":  # torch.cuda.get_device_name(): nvidia-smi's name
            return self.fact("gpu.name")
        if name in ("get_device_memory_capacity", "get_nvgpu_memory_capacity"):  # MiB, as nvidia-smi
            return self.fact("gpu.memory_mib")
        value = platform(name, self.env.facts, self.out)
        if value is None and isinstance(func, ast.Name):
            value = self.followed(Follower.helper_value, node, depth)
            if value is UNKNOWN:  # `get_moe_runner_backend()`: what its global's setter stores
                value = self.followed(Follower.stored_value, node, depth)
            value = None if value is UNKNOWN else value
        if value is None:
            value = self.world(name, self.out)
        if value is not None:
            return value
        if name in _STR_METHODS and isinstance(func, ast.Attribute) and not node.args:
            text = self.ev(func.value, depth)  # `self.model_path.lower()`
            if isinstance(text, str):
                return getattr(text, name)()
        if name == "frozenset" and len(node.args) == 1:  # a constant set of names
            try:
                return frozenset(ast.literal_eval(node.args[0]))
            except (ValueError, TypeError, SyntaxError):
                return UNKNOWN
        if isinstance(func, ast.Attribute) and (method := self.enum_method(node, func, depth)) is not None:
            return method
        arity = 1 if len(node.args) == 1 and SERVER_ARGS.search(dotted_name(node.args[0])) else 0
        queries = self.env.queries if len(node.args) == arity and not node.keywords and depth < 5 else None
        if queries is not None and (query := queries(name, arity)) is not None:
            return self.query(*query, depth)
        self.out.runtime.append(name + "()")
        return UNKNOWN

    def enum_method(self, node: ast.Call, func: ast.Attribute, depth: int) -> Any:
        """A method of one of the tree's enums, on the class (`Mode.from_string(cfg.x)`) or on a
        member (`self.mode.is_none()`), evaluated from its body with the arguments in place; None
        when it is not one (or it cannot be read)."""
        enums = self.env.facts.get(CODE_ENUMS, {})
        if self.env.queries is None or depth >= 5 or node.keywords or not enums:
            return None
        owner = dotted_name(func.value)
        if owner in enums:
            first = ast.Name(owner, ast.Load())  # `cls`
        else:
            scratch = Outcome()  # a receiver that is no member leaves no trace in the answer
            value = Evaluator(self.env, scratch, self.steps).ev(func.value, depth)
            if not (isinstance(value, Member) and value.partition(".")[0] in enums):
                return None
            self.out.used += scratch.used
            self.out.flag_dependent |= scratch.flag_dependent  # `Mode(args.x).is_y()` tests the flag
            owner, first = value.partition(".")[0], parse_guard(value)
        query = self.env.queries(f"{owner}.{func.attr}", -1)
        lam = parse_guard(query[0]) if query else None
        if not isinstance(lam, ast.Lambda) or len(lam.args.args) != len(node.args) + 1:
            return None
        bound = dict(zip([a.arg for a in lam.args.args], [first, *node.args], strict=True))
        body = BindParams(bound).visit(copy.deepcopy(lam.body))  # `parse_guard` is cached: bind a copy
        return self.ev(body, depth + 1)

    def query(self, text: str, consts: dict[str, str], where: str, depth: int) -> Any:
        """A one-line query function's returned expression, evaluated where it is defined."""
        env = self.env
        inner = Env(env.facts, env.flag, env.dests, {}, {}, consts, frozenset(), where, env.queries)
        node = parse_guard(text)
        return UNKNOWN if node is None else Evaluator(inner, self.out, self.steps).ev(node, depth + 1)

    def boolop(self, node: ast.BoolOp, depth: int) -> Any:
        is_and = isinstance(node.op, ast.And)
        unknown, last = False, None
        for sub in node.values:
            last = self.ev(sub, depth)
            t = truth(last)
            if t is UNKNOWN:
                unknown = True
            elif t != is_and:  # a False in `and`, a True in `or` decides
                return last if not is_and else False
        return UNKNOWN if unknown else last

    def compare(self, node: ast.Compare, depth: int) -> Any:
        left = self.ev(node.left, depth)
        result: Any = True
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = self.ev(right_node, depth)
            r = compare_values(left, op, right)
            if r is False:
                return False
            if r is UNKNOWN:
                result = UNKNOWN
            left = right
        return result
