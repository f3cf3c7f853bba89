"""The records of the flag index (what `walk.file` extracts and `index` stores).

Kept apart from the walker so readers of the index import only these plain dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Call", "Exit", "Func", "ModuleFacts", "Read"]


@dataclass
class Read:
    """A load of a flag's dest: where, in which function, under which guards, feeding what."""

    dest: str
    path: str
    line: int
    func: str
    cls: str | None
    receiver: str
    guards: list[str]
    cond: str | None
    """The whole boolean expression or `if` test holding the read (evaluated with the flag set)."""
    local: str | None
    """The local name the read is assigned to (`backend = cfg.x`), followed through later guards."""
    effect: str | None
    inert: bool
    exit_body: bool = False
    """The read is in the test of an `if` whose body ends in return/raise: when the test is false
    the function goes on, so the flag acts by *not* taking the exit."""
    store: str | None = None
    """The value is only stored: the target of `obj.x = <read>` or `global X; X = <read>`."""
    passed_to: str | None = None
    """The function the value is passed to directly (`set_x(<read> and ...)`), by its last name."""


@dataclass
class Exit:
    """A `raise`, a failing `assert`, a guarded fallback (warning + return / switched off), or an
    override: a guarded `return {"dest": value}` of an argument-resolution pass (`sets`, `values`)."""

    kind: str
    line: int
    message: str
    guards: list[str]
    exc: str = ""
    sets: list[str] = field(default_factory=list)
    values: list[str] = field(default_factory=list)


@dataclass
class Call:
    """A call site: callee's last name, its guards, and the argument texts (positional, keyword)."""

    callee: str
    line: int
    guards: list[str]
    args: list[str]
    kwargs: dict[str, str]
    bare: bool = False
    """A statement of its own (`f(x)`): the value is dropped, the call is done for what it does."""
    receiver: str | None = None
    """The plain name a method is called on (`self`, `cls`, a class: `cls.get_fn()`), else None."""


@dataclass
class Func:
    """A function: parameters, single-assigned locals, calls, exits, registry keys, lazy imports."""

    qual: str
    path: str
    line: int
    end: int
    params: list[str]
    locals: dict[str, str | None] = field(default_factory=dict)
    assigned: dict[str, list[tuple[int, list[str], str]]] = field(default_factory=dict)
    """Locals assigned more than once, each time by a plain `x = <expr>` outside loops: every
    assignment's line, enclosing tests and value, in order (`x = args.b; if x == "auto": x = pick()`:
    the value at a later line follows from the tests, `reach.value_at`)."""
    calls: list[Call] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    keys: list[tuple[str, str]] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)
    gates: list[Exit] = field(default_factory=list)
    """Early returns (`if world_size <= 1: return False`): kind "return", guards = the enclosing
    tests and its own (not the earlier early returns: returning there returns too)."""
    value: str | None = None
    """The expression of a function whose whole body is `return <expr>`, after any asserts (a
    one-line query)."""
    refs: list[str] = field(default_factory=list)
    """Function names it uses without calling them (`partial(f, x)`, `run=f`): called elsewhere."""
    outside: list[Call] = field(default_factory=list)
    """Calls of functions defined outside the tree (`torch.distributed.barrier()`), logging aside."""
    gives: bool = False
    """Some `return` gives a value (its callers use what it computes)."""
    stores: list[tuple[str, int]] = field(default_factory=list)
    """A setter's targets and lines: the whole body only stores (`global X; X = enable`, `self.x =
    x`), without calls or branches. Empty for any other function."""
    uses: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """Parameter -> how the body uses it: ("test", the `if`/`while` test holding it), ("store",
    attr) for `self.attr = param`, ("other", "") for anything else (a call, a return, ...)."""
    typed: list[str] = field(default_factory=list)
    """Names the function uses only as the class of an `isinstance`/`issubclass` test."""
    receivers: list[str] = field(default_factory=list)
    """Names the function uses only to take their attributes (`Cls.is_applicable(x)`, `f =
    Cls.forward`) or in type tests."""
    entries: dict[str, list[tuple[str, tuple[str, ...], int]]] = field(default_factory=dict)
    """Names the function uses, calls aside, only as values of string-keyed dict literals -> (the
    key, the dict's keys, the line) per use (`walk.names.table_entries`): a dispatch table."""
    tested: list[str] = field(default_factory=list)
    """Names the function only tests membership in (`x in TABLE`, `TABLE.keys()`): it reads no
    entry of them."""
    probed: dict[str, list[str]] = field(default_factory=dict)
    """Tables the function reads only to call methods on their entries -> those methods
    (`walk.names.probed_tables`): it builds an entry only if such a method does (`cls(...)`)."""
    sets: list[Exit] = field(default_factory=list)
    """`self.<dest> = <constant>` (kind "assign", under the statement's guards): in argument
    resolution code, what the server sets a flag to by itself (kept for those paths only)."""


@dataclass
class ModuleFacts:
    """What one file contributes to the index."""

    path: str
    module: str
    consts: dict[str, str] = field(default_factory=dict)
    imports: list[str] = field(default_factory=list)
    classes: dict[str, list[str]] = field(default_factory=dict)
    """Class name -> the fields it declares (class-level annotations)."""
    bases: dict[str, list[str]] = field(default_factory=dict)
    """Class name -> its bases' last names: building the class runs the bases' methods too."""
    funcs: list[Func] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    refs: list[str] = field(default_factory=list)
    """Names module-level code uses without calling them (outside `tables`)."""
    loose: list[str] = field(default_factory=list)
    """Names module-level code loads other than to fill a table in (`walk_file`'s `_loose`)."""
    held: dict[str, list[str]] = field(default_factory=dict)
    """Names module-level code loads only to take attributes of them -> those attributes
    (`walk.names.attribute_holders`): a class used so is not built there."""
    tables: dict[str, list[str]] = field(default_factory=dict)
    keyed: set[str] = field(default_factory=set)
    """The `tables` that are dicts (iterating one, or `[*TABLE]`, gives its keys)."""
    """Module-level literal tables -> the names they hold (`QUANTIZATION_METHODS = {"fp8":
    Fp8Config, ...}`): what they hold is used where the table is read."""
    rebound: set[str] = field(default_factory=set)
    """Module names some function rebinds with `global` (not constants)."""
    enums: dict[str, dict[str, object]] = field(default_factory=dict)
    """Enum classes -> their members with constant values (`DisaggregationMode.DECODE = "decode"`)."""
    loads: set[str] = field(default_factory=set)
    """Attribute names the module reads (`x.attr` loads): a stored attribute nobody reads is dead."""
    computed: dict[str, str] = field(default_factory=dict)
    """Class-level fields a named function computes (`attn_tp_size = Derived(fn="sglang.srt.x.
    attn_tp_size_of")`): field -> the function's dotted path; folded into the index's `computed`."""
    attrs: list[tuple[str, str, str]] = field(default_factory=list)
    """`self.<attr> = <expr>` in a class: (class, attr, expr source); folded into the index's
    `config_attrs` and emptied when the index is written."""
    edges: list[tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]] = field(default_factory=list)
    """Every import, module- or function-level: (dotted name, guards, registry keys of the function)."""
