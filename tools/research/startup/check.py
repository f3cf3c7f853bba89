"""One flag against SGLang's own start-up decisions on one deployment: the deployment's command
line and the same line with the flag, each resolved by the version's own code (`resolver.py`).

- `refused`: SGLang raised or asserted on the flag (its own message, its own `file:line`);
- `same`: the resolved configuration is identical with and without the flag (a reset, an alias
  onto a value already in force, a value the server picks by itself): nothing can change at run time;
- `changed`: the configuration differs (`changed` names the settings): whether the change acts
  is for the code's readers to say (`tools.research.analysis`);
- `unknown`: the resolution could not be run or attributed (no hardware facts, a stand-in failed).

The hardware is the GPUs' facts (`gpu.*`), or on a CPU deployment (no GPU, `--device cpu`) its
host's (`cpu.*`, `tools.research.target.cpu`); the deployment's own SGLang variables (`env.*`,
from the unit's `Environment=`) are set in the worker before SGLang is imported.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tools.research.source import SourceTree
from tools.research.startup.isolation import level
from tools.research.startup.resolver import Resolver, ResolverError

MODEL_FLAGS = ("--model-path", "--model")
"""Left out of the command line the check resolves: it serves its own copy of the config.json."""
HW_FACTS = {"sm": "gpu.sm", "count": "gpu.count", "memory_mib": "gpu.memory_mib", "name": "gpu.name"}
CPU_FACTS = {k: f"cpu.{k}" for k in ("arch", "count", "memory_mib", "memory_max", "numa_nodes", "amx")}
"""What SGLang's CPU engine reads of its host while it resolves (`worker/fake_cpu.py`)."""
ENV_PREFIX = "env."
"""Facts `env.SGLANG_...`: the deployment's own SGLang variables."""
_RESOLVERS: dict[tuple[str, str, str, str], Resolver] = {}


@dataclass
class StartupAnswer:
    """What SGLang's own argument resolution says of a flag here (see the module docstring)."""

    kind: Literal["refused", "same", "changed", "unknown"]
    message: str = ""
    where: str | None = None
    changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    """The deployment's own resolved arguments: what the server really runs (without the flag when
    it already ran with exactly that setting)."""
    lines: list[str] = field(default_factory=list)
    """`path:line` of the tree that ran while the line with the flag resolved and name its setting,
    in order: the last is where SGLang settled (or refused) it."""
    model: dict[str, Any] = field(default_factory=dict)
    """The scalar attributes of SGLang's own ModelConfig for the deployment (`is_hybrid_swa`,
    `attention_arch` as `AttentionArch.MHA`, `quantization`, ...); empty when it was not built."""
    stored: bool | None = None
    """Whether SGLang's own parser stores anything for the flag (False: its action only warns, as a
    deprecation that names no replacement; None: not known)."""
    note: str = ""
    """One line when the worker that answered ran without bubblewrap (what isolated it instead), or
    when the launch's checks of the resolved configuration (`check_server_args`) could not run
    here (why): a refusal of theirs would then go unseen."""


_MODEL_KEY = "__model_config__"
"""Where the worker puts the ModelConfig's attributes among the resolved arguments."""
ENUM_MEMBERS = "__enum_members__"
"""Among those attributes: every member (`AttentionArch.MLA`) of the enums they hold."""


_PARSED_KEY = "__parsed__"
"""Where the worker puts what the parser stored, before any resolution."""


def _split(args: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(resolved arguments, ModelConfig attributes) of one worker answer."""
    rest = dict(args)
    rest.pop(_PARSED_KEY, None)
    return rest, rest.pop(_MODEL_KEY, None) or {}


def _stored(base: dict[str, Any], trial: dict[str, Any], flag: list[str]) -> bool | None:
    """Whether the parser stored something for the flag: the two parses differ, or the flag's
    setting holds the value asked for, which is its default (0.5.15.post1's `--linear-attn-backend
    triton` parses as the line without it does); None: unknown."""
    before, after = base.get(_PARSED_KEY), trial.get(_PARSED_KEY)
    if before is None or after is None:
        return None
    asked = " ".join(flag[1:]) if len(flag) > 1 else "True"
    return before != after or any(
        name in after and _spelled_value(after[name]) == asked for name in settings_of(flag[0])
    )


def _spelled_value(value: Any) -> str:
    """A parsed value as a command line spells it (`8192`, `triton`, `1 2 4` for a list)."""
    return " ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def on_cpu(facts: dict[str, Any]) -> bool:
    """Whether the deployment runs SGLang's CPU engine: no GPU, and `--device cpu` in its unit."""
    return facts.get("gpu.count") == 0 and facts.get("flag.device") == "cpu"


def hardware_of(facts: dict[str, Any]) -> dict[str, Any] | None:
    """The resolver's hardware from the deployment's facts: the GPUs' four, or a CPU host's (all of
    `CPU_FACTS`, with no GPU); None unless all are known (a guessed memory size would make SGLang
    pick other sizes than the real server does)."""
    if on_cpu(facts):
        cpu = {k: facts.get(f) for k, f in CPU_FACTS.items()}
        if any(v is None for v in cpu.values()):
            return None
        return {"sm": 0, "count": 0, "memory_mib": 0, "name": "", "cpu": cpu}
    hw = {k: facts.get(f) for k, f in HW_FACTS.items()}
    return hw if all(v is not None for v in hw.values()) else None


def missing_hardware(facts: dict[str, Any]) -> str:
    """Why `hardware_of(facts)` is None: the facts it lacks, by name."""
    if on_cpu(facts):
        return ", ".join(f for f in CPU_FACTS.values() if facts.get(f) is None) + " unknown"
    if facts.get("gpu.count") == 0:
        return "no GPU (gpu.count 0) and the unit does not say --device cpu"
    return ", ".join(f for f in HW_FACTS.values() if facts.get(f) is None) + " unknown"


def environment_of(facts: dict[str, Any]) -> dict[str, str]:
    """The deployment's SGLang variables (`env.NAME` facts) as the worker's environment."""
    return {k.removeprefix(ENV_PREFIX): str(v) for k, v in facts.items() if k.startswith(ENV_PREFIX)}


def flag_argv(flag: str, value: Any, *, takes_value: bool = False) -> list[str] | None:
    """`--flag` for a switch (value None or True), else `--flag VALUE`; None for a flag that takes a
    value when none is given, or for False (there is nothing to try; `--no-x` spells a switch off)."""
    if (value is None and takes_value) or value is False:
        return None
    if value is None or value is True:
        return [flag]
    return [flag, *str(value).split()] if isinstance(value, str) else [flag, str(value)]


def takes_value(info: Any) -> bool:
    """Whether a catalog entry (`FlagInfo`) is a flag that needs a value on the command line (not a
    switch, nor a deprecated switch whose type the catalog leaves open)."""
    return info is not None and info.type not in (None, "bool") and not isinstance(info.default, bool)


def unit_settings(flags: dict[str, str | None]) -> dict[str, Any]:
    """A unit file's launch flags (`--flag` -> value, None for a switch) as settings for `argv_of`,
    without the model."""
    return {f: True if v is None else v for f, v in flags.items() if f not in MODEL_FLAGS}


def argv_of(settings: dict[str, Any]) -> list[str]:
    """A command line from launch settings (`tp_size: 4` -> `--tp-size 4`, `True` -> the bare
    switch; False and None are left out: they are the defaults a command line cannot spell)."""
    argv: list[str] = []
    for dest, value in settings.items():
        flag = "--" + dest.lstrip("-").replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not None and value is not False:
            argv += [flag, *str(value).split()]
    return argv


def without(argv: list[str], flag: str) -> list[str]:
    """`argv` with every spelling of `flag` (`--x`, `--x=v`, `--no-x`, `--x` for `--no-x`) and the
    values that follow it removed."""
    name = flag.lstrip("-").removeprefix("no-")
    spellings = {f"--{name}", f"--no-{name}"}
    out: list[str] = []
    skipping = False
    for token in argv:
        if token.startswith("--"):  # SGLang's options are long; "-1" is a value
            skipping = token.split("=", 1)[0] in spellings
            if not skipping:
                out.append(token)
        elif not skipping:
            out.append(token)
    return out


def _spelled(argv: list[str], flag: str) -> list[str] | None:
    """The values `argv` gives `flag` (the last time it names it), None when it does not."""
    found: list[str] | None = None
    for i, token in enumerate(argv):
        if token == flag:
            found = []
            for value in argv[i + 1 :]:
                if value.startswith("--"):
                    break
                found.append(value)
        elif token.startswith(flag + "="):
            found = [token.split("=", 1)[1]]
    return found


def settings_of(flag: str) -> list[str]:
    """The setting names a flag writes, as SGLang's code spells them (`--no-x` also `x`)."""
    name = flag.lstrip("-").replace("-", "_")
    return [name, name.removeprefix("no_")] if name.startswith("no_") else [name]


def resolver_for(tree: SourceTree, hw: dict[str, Any], env: dict[str, str] | None = None) -> Resolver:
    """One worker per tree, hardware, environment and isolation level for the life of the process."""
    try:
        isolated = level()
    except ValueError as e:  # a level $OPTAGENT_RESOLVER_ISOLATION does not know
        raise ResolverError(str(e)) from e
    key = (str(tree.root.resolve()), repr(sorted(hw.items())), repr(sorted((env or {}).items())), isolated)
    if key in _RESOLVERS and not _RESOLVERS[key].alive:  # a worker that died is started anew
        _RESOLVERS.pop(key).close()
    if key not in _RESOLVERS:
        _RESOLVERS[key] = Resolver(tree, hw, env=env)
    return _RESOLVERS[key]


@atexit.register
def _close_all() -> None:
    for resolver in _RESOLVERS.values():
        resolver.close()
    _RESOLVERS.clear()


def startup_answer(
    tree: SourceTree,
    facts: dict[str, Any],
    flag: list[str] | None,
    *,
    base_argv: list[str],
    model_config: Path | None,
) -> StartupAnswer:
    """Resolve the deployment's command line as it is and with `flag` in place of its own setting
    of it, with the deployment's hardware and model. A deployment that already runs with exactly
    this setting is compared with itself without it (what the flag does there)."""
    if not flag:
        return StartupAnswer("unknown", "not run: the flag takes a value and none was given")
    rest = without(base_argv, flag[0])
    if _spelled(base_argv, flag[0]) == flag[1:]:
        base_argv = rest  # it already runs with it: what it does is the difference to its default
    hw = hardware_of(facts)
    if hw is None:
        return StartupAnswer("unknown", f"not run: {missing_hardware(facts)}")
    if model_config is None:
        return StartupAnswer("unknown", "not run: no model config")
    try:
        resolver = resolver_for(tree, hw, environment_of(facts))
        answer = _compare(resolver, base_argv, rest, flag, model_config)
    except ResolverError as e:
        return StartupAnswer("unknown", f"not run: {e}")
    if resolver.level != "bubblewrap":
        isolated = f"SGLang's start-up ran isolated by {resolver.isolation} (no bubblewrap here)"
        answer.note = "; ".join(filter(None, [isolated, answer.note]))
    return answer


def _compare(
    resolver: Resolver, base_argv: list[str], rest: list[str], flag: list[str], model_config: Path
) -> StartupAnswer:
    """The deployment's line and the line with the flag, each resolved, compared."""
    base = resolver.resolve(base_argv, model_config)
    if not base["ok"]:
        return StartupAnswer(
            "unknown", f"the deployment itself does not resolve here: {base['error']}", base.get("where")
        )
    trial = resolver.resolve([*rest, *flag], model_config, watch=settings_of(flag[0]))
    before, model = _split(base["args"])
    if not trial["ok"]:
        kind = "refused" if trial.get("kind") == "refused" else "unknown"
        return StartupAnswer(
            kind,
            trial["error"],
            trial.get("where"),
            baseline=before,
            lines=trial.get("lines", []),
            model=model,
        )
    after, model_after = _split(trial["args"])
    changed = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
    if model and model_after:  # a flag that changes what the model runner is built from changes something
        changed |= {
            f"model_config.{k}": (model.get(k), v)
            for k, v in model_after.items()
            if model.get(k) != v and k != ENUM_MEMBERS
        }
    kind = "changed" if changed else "same"
    stored = _stored(base["args"], trial["args"], flag)
    lines = trial.get("lines", [])
    unchecked = trial.get("checks") or base.get("checks")
    note = f"SGLang's launch checks (check_server_args) did not run here: {unchecked}" if unchecked else ""
    return StartupAnswer(
        kind, changed=changed, baseline=before, lines=lines, model=model, stored=stored, note=note
    )
