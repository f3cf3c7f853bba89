"""Following a guard's values into the tree (`Follower`, which `guards.evaluator.Evaluator`
inherits): a helper's call to its `return` with the arguments bound, the entry of a dict it
returns, the world size of a process group it returns, a world size set in a local. This is how
`get_moe_expert_parallel_world_size() > 1` is decided from the deployment's sizes (issue 53)."""

from __future__ import annotations

import ast
import copy
import re
from typing import Any

from tools.research.guards.terms import (
    HELPER,
    SERVER_ARGS,
    SET_ONCE,
    STORED,
    BindParams,
    Env,
    Outcome,
    dotted_name,
    is_container,
    parse_guard,
)
from tools.research.platform_facts import PARALLEL_SIZES, UNKNOWN, topology

MAX_FOLLOW = 8
"""Helpers, locals and entries followed deep from a guard (`get_tensor_model_parallel_world_size()`
-> `get_tp_group().world_size` -> `get_parallel().tp_group` -> `tp_size`: three)."""


_GROUP = re.compile(r"(\w+?)_group")
"""A process group held as `<dim>_group` (`get_parallel().pp_group`, `self.attn_tp_group`)."""
_UNBOUND = ast.Name("__unbound__", ast.Load())
"""A helper's parameter its call leaves to the default, or binds to what cannot be moved into the
helper's scope: unknown."""


class Follower:
    """The following half of the evaluator; `env`, `out`, `steps` and `ev` are the evaluator's."""

    env: Env
    out: Outcome
    steps: list[int]

    def ev(self, node: ast.expr, depth: int) -> Any:  # the evaluator's own
        raise NotImplementedError

    def world(self, name: str, out: Outcome, receiver: str = "") -> Any:
        """`topology` of `name` with the researched flag's trial value in place of the deployment's
        parallel sizes (`--tp-size 2` on a one-rank server is no longer one rank); a size the trial
        value changes is the flag's doing."""
        trial = {f"server.{d}": v for d, v in self.env.flag.items() if d in PARALLEL_SIZES}
        size = topology(name, {**self.env.facts, **trial}, out, receiver=receiver)
        if (
            trial
            and size is not None
            and size != topology(name, self.env.facts, Outcome(), receiver=receiver)
        ):
            out.flag_dependent = True
        return size

    def size_named(self, name: str, depth: int) -> Any:
        """A world size named in the code (`world_size`, `attn_tp_size`): the local it is set from
        when that gives it (`attn_tp_size = parallel.attn_tp_size`), else `topology` by its name;
        None when the name is no world size."""
        scratch = Outcome()
        size = self.world(name, scratch)
        text = self.env.locals.get(name)
        if size is UNKNOWN and text and depth < MAX_FOLLOW and (sub := parse_guard(text)) is not None:
            local = Outcome()
            if (value := type(self)(self.env, local, self.steps).ev(sub, depth + 1)) is not UNKNOWN:
                self.out.used += local.used
                self.out.flag_dependent |= local.flag_dependent
                return value
        self.out.used += scratch.used
        self.out.missing += scratch.missing
        self.out.runtime += scratch.runtime
        return size

    def followed(self, how: Any, node: ast.expr, depth: int, **kw: Any) -> Any:
        """`how(node, depth)` evaluated on scratch: its trace joins the answer only when it is known
        (an unknown follow leaves the name's own reading, `topology`, to decide)."""
        if self.env.queries is None or depth >= MAX_FOLLOW:
            return UNKNOWN
        scratch = Outcome()
        value = how(type(self)(self.env, scratch, self.steps), node, depth, **kw)
        if value is not UNKNOWN:
            self.out.used += scratch.used
            self.out.flag_dependent |= scratch.flag_dependent
        return value

    def unfold(self, node: ast.Call, depth: int) -> tuple[ast.expr, Follower] | None:
        """The returned expression of the tree's helper `node` calls (`get_tp_group()` ->
        `get_parallel().tp_group`), its parameters bound to the call's arguments, with an evaluator
        of the helper's own module; None when the call is of no such helper."""
        if not isinstance(node.func, ast.Name) or self.env.queries is None or depth >= MAX_FOLLOW:
            return None
        query = self.env.queries(node.func.id, HELPER)
        lam = parse_guard(query[0]) if query else None
        if query is None or not isinstance(lam, ast.Lambda):
            return None
        params = [a.arg for a in lam.args.args]
        names = [k.arg for k in node.keywords]
        if len(node.args) > len(params) or None in names or not set(names) <= set(params[len(node.args) :]):
            return None  # `*args`, `**kw`, or more than it takes: not followed
        given = [*zip(params, node.args, strict=False), *((k.arg, k.value) for k in node.keywords)]
        bound = dict.fromkeys(params, _UNBOUND) | {p: self.movable(a, depth) for p, a in given}
        body = BindParams(bound).visit(copy.deepcopy(lam.body))  # `parse_guard` is cached: bind a copy
        text, consts, where = query
        env = self.env
        inner = Env(env.facts, env.flag, env.dests, {}, {}, consts, frozenset(), where, env.queries)
        return body, type(self)(inner, self.out, self.steps)

    def movable(self, arg: ast.expr, depth: int) -> ast.expr:
        """A caller's argument as it can stand in the helper's body: its value when known, the
        server args (`cfg`, whose attributes are settings wherever they are read), else unknown."""
        if dotted_name(arg) and SERVER_ARGS.search(dotted_name(arg)):
            return arg
        scratch = Outcome()
        value = type(self)(self.env, scratch, self.steps).ev(arg, depth)
        if isinstance(value, bool | int | float | str) or value is None:
            self.out.used += scratch.used
            return ast.Constant(value)
        return arg if isinstance(arg, ast.Call) and not arg.args and not arg.keywords else _UNBOUND

    def helper_value(self, node: ast.Call, depth: int) -> Any:
        """What a call of one of the tree's helpers returns here (`get_attention_tp_size()` ->
        `get_parallel().attn_tp_size`), else UNKNOWN."""
        unfolded = self.unfold(node, depth)
        return UNKNOWN if unfolded is None else unfolded[1].ev(unfolded[0], depth + 1)

    def stored_value(self, node: ast.Call, depth: int) -> Any:
        """What a getter of a module global hands out here (`get_moe_runner_backend()`): what the
        global's setter stores, evaluated in the setter's module (`FlagIndex.stored`), else UNKNOWN."""
        if not isinstance(node.func, ast.Name) or node.args or node.keywords or self.env.queries is None:
            return UNKNOWN
        return self._elsewhere(self.env.queries(node.func.id, STORED), depth)

    def set_once(self, node: ast.Attribute, depth: int) -> Any:
        """`self.<attr>` as the class sets it once, in its `__init__` (`FlagIndex.set_once`), else
        UNKNOWN."""
        if self.env.queries is None or not self.env.where:
            return UNKNOWN
        return self._elsewhere(self.env.queries(f"{self.env.where}#{node.attr}", SET_ONCE), depth)

    def _elsewhere(self, query: tuple[str, dict[str, str], str] | None, depth: int) -> Any:
        """An expression of another function (a query's), evaluated in its module, or UNKNOWN."""
        sub = parse_guard(query[0]) if query else None
        if query is None or sub is None or is_container(sub):
            return UNKNOWN
        env = self.env
        inner = Env(env.facts, env.flag, env.dests, {}, {}, query[1], frozenset(), query[2], env.queries)
        return type(self)(inner, self.out, self.steps).ev(sub, depth + 1)

    def entry(self, node: ast.Call, depth: int, *, key: str) -> Any:
        """The `key` entry of the dict a helper returns (`{"attn_tp_size": tp // dp, ...}`)."""
        unfolded = self.unfold(node, depth)
        if unfolded is not None and isinstance(unfolded[0], ast.Call):  # the dict of a helper it calls
            return unfolded[1].entry(unfolded[0], depth + 1, key=key)
        if unfolded is None or not isinstance(unfolded[0], ast.Dict):
            return UNKNOWN
        body, inner = unfolded
        for k, v in zip(body.keys, body.values, strict=True):
            if isinstance(k, ast.Constant) and k.value == key:
                return inner.ev(v, depth + 1)
        return UNKNOWN

    def group_size(self, node: ast.expr, depth: int) -> Any:
        """The world size of the process group `node` is, found through the helpers that return it
        and the locals that hold it: a group held as `<owner>.<dim>_group` is that parallel
        dimension's, as wide as `<owner>.<dim>_size` (SGLang 0.5.23 builds each group at the width it
        publishes under that name: parallel_state.py:2629-2637, TP :2674-2683, PP :2952-2960). UNKNOWN otherwise."""
        if depth >= MAX_FOLLOW:
            return UNKNOWN
        held = None
        if isinstance(node, ast.Name):
            held = self.env.locals.get(node.id)
        elif isinstance(node, ast.Attribute) and dotted_name(node.value) == "self":
            held = self.env.locals.get(f"self.{node.attr}")  # `self.pp_group = get_pp_group()`
        if held and (sub := parse_guard(held)) is not None:
            return self.group_size(sub, depth + 1)
        if isinstance(node, ast.Attribute) and (m := _GROUP.fullmatch(node.attr)):
            return self.ev(ast.Attribute(node.value, f"{m.group(1)}_size", ast.Load()), depth + 1)
        if isinstance(node, ast.Call) and (unfolded := self.unfold(node, depth)) is not None:
            return unfolded[1].group_size(unfolded[0], depth + 1)
        return UNKNOWN
