"""A flag's verdict on one deployment, decided from the code (issue 10).

`analyze_flag` takes the index of the running SGLang version, the flag (any spelling: `--x`, `x`,
`x_y`, `--no-x`), the deployment's facts (`gpu.sm`, `gpu.count`, `server.<dest>`, `model.<fact>`)
and optionally the value to try. It follows a deprecated flag to its replacement, keeps only readers
on the serving path that read *this* setting (not a same-named attribute of another object), drops
readers in modules this deployment does not load (dispatch context) or in functions registered for
other model architectures, evaluates each reader's guards three-valued with the flag set, and
follows calls to the exits the flag can reach. A reader inside a test or a boolean value is judged
by whether the flag changes it: `enable = not cfg.disable_x` and `if cfg.disable_x: return` act
(they turn), `if cfg.x or sm90:` on an SM90 does not (the same either way); a `raise`/`assert`
test that turns counts as a refusal only in argument code that surely runs here. Verdicts:

- `incompatible-with-version`: not a flag of this version (the server would refuse the argument);
- `refuses-to-start`: a `raise`/`assert` reached from a running reader fires here;
- `dead`: nothing on the serving path reads it (or only logs it);
- `no-op`: every reader is off here (a guard fails, its module is not loaded, or a fallback fires),
  its only effect is an override to the value the server has anyway, or a resolution pass sets the
  trial value back (`return {"dest": v}`, `tools.research.gates.overridden`), or gives the flag the trial
  value by itself here (`self.dest = v` under guards that hold, `tools.research.gates.set_anyway`);
- `applies`: a reader runs here; `unknown`: it depends on a deployment fact nobody gave.

Where SGLang's own start-up run sets the flag back to its value without it (after argument code
changed other settings with it), code that runs after start-up reads that value: those readers are
off, and what argument code changed on the way decides (`_reset_at_startup`).
"""

from __future__ import annotations

import re
from typing import Any

from tools.research.callers import reached
from tools.research.catalog import FlagInfo, find_flag, negated
from tools.research.facts import default_facts, deployment_facts
from tools.research.findings import CodeVerdict, Finding, reader_findings
from tools.research.flag_index.budget import named
from tools.research.flag_index.lookup import FlagIndex
from tools.research.flag_index.serving_path import MAX_FILE_BYTES, is_config_path
from tools.research.gates import filled_in
from tools.research.guards.terms import non_default
from tools.research.startup.check import StartupAnswer
from tools.research.verdict.calibration import certainty
from tools.research.verdict.decide import Question, decide, is_validator

__all__ = ["CodeVerdict", "Finding", "analyze_flag"]


def parse_literal(text: str) -> Any:
    """`4` -> 4, `0.9` -> 0.9, `true`/`false`/`none`, anything else the text."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None, "null": None}.get(text.lower(), text)


def _parse_value(text: str | None, info: FlagInfo) -> Any:
    if text is None:
        return True if info.type == "bool" else non_default(info.default)
    return parse_literal(text)


def _replacement(index: FlagIndex, info: FlagInfo) -> tuple[FlagInfo, str | None] | None:
    """The flag (and value) a deprecated flag's help points to, when it is in the catalog."""
    if not (info.deprecated and info.replacement):
        return None
    name, _, value = info.replacement.partition("=")
    target = find_flag(index.catalog, name.split()[0])
    if target is None or target.dest == info.dest:
        return None
    return target, (value or None)


def analyze_flag(
    index: FlagIndex,
    flag: str,
    facts: dict[str, Any],
    *,
    value: str | None = None,
    startup: StartupAnswer | None = None,
) -> CodeVerdict:
    """The verdict of `flag` (set to `value`, or on for a boolean) on the deployment `facts`.

    `startup` is what SGLang's own argument resolution said of the flag here
    (`tools.research.startup.check`): its refusal, or an identical configuration, decides; a changed
    configuration leaves the verdict to the readers, minus the refusals and resets in argument code
    that the real resolution did not make.

    One piece because it builds one verdict in the order its parts depend on each other: the catalog
    entry, the facts, the replacement researched, the notes, the readers, then `decide`.
    """
    name = "--" + flag.strip().lstrip("-").replace("_", "-")
    info = find_flag(index.catalog, name)
    if info is None:
        return CodeVerdict(
            name,
            name[2:].replace("-", "_"),
            index.version,
            "incompatible-with-version",
            f"{name} is not a launch_server flag of SGLang {index.version}: the server would refuse to start.",
            certainty("not-a-flag", "catalog"),
            rule="not-a-flag",
            basis="catalog",
        )
    declared = default_facts(index.catalog)
    facts = deployment_facts(index, facts, startup, declared)
    facts = {**facts, **filled_in(index, facts)}
    trial = False if negated(info, name) else _parse_value(value, info)
    verdict = CodeVerdict(info.name, info.dest, index.version, "unknown", "", 0.3, value=trial)
    verdict.definition = f"{info.path}:{info.line}" if info.path else None
    verdict.help = info.help
    target = info
    if (repl := _replacement(index, info)) is not None:
        target, repl_value = repl
        trial = (
            _parse_value(repl_value, target)
            if repl_value or target.type == "bool"
            else non_default(target.default)
        )
        verdict.researched_as = target.name + (f"={repl_value}" if repl_value else "")
        verdict.notes.append(f"deprecated: researched through its replacement {verdict.researched_as}")
    elif info.deprecated:
        verdict.notes.append("deprecated; no replacement named")
    if index.skipped:
        verdict.notes.append(f"not read, over {MAX_FILE_BYTES >> 20} MB: {named(index.skipped)}")
    verdict.notes += index.unread
    if cut := index.cut.get(target.dest):
        verdict.notes.append(
            f"only the first {cut[0]:,} of {cut[1]:,} reads of `{target.dest}` are indexed (the cap per setting)"
        )
    # the alias keeps its own trial value: `if cfg.old_flag and cfg.new_flag is None` is about the trial
    flag_values = {info.dest: verdict.value, target.dest: trial}
    # the deployment without the flag: its dests at their declared defaults (unknown when None)
    without = {k: v for k, v in facts.items() if k.removeprefix("server.") not in flag_values}
    without.update({f"server.{d}": declared[f"server.{d}"] for d in flag_values if f"server.{d}" in declared})
    reader_findings(index, target.dest, facts, flag_values, verdict, without)
    if startup is not None and startup.kind == "changed":
        _drop_argument_refusals(verdict)
        _reset_at_startup(verdict, startup, target.dest, trial)
        _settled_in_argument_code(index, verdict, startup, facts, flag_values, without)
    decide(Question(verdict, target, startup, index, facts, flag_values))
    if startup is not None and startup.kind == "changed":
        verdict.notes.append(f"SGLang's own argument resolution here changes: {_changes(startup)}")
    return verdict


def _settled_in_argument_code(
    index: FlagIndex,
    v: CodeVerdict,
    startup: StartupAnswer,
    facts: dict[str, Any],
    flag_values: dict[str, Any],
    without: dict[str, Any],
) -> None:
    """A running reader in argument code ran when SGLang resolved the flag here: what it did is in
    the resolved configuration. When resolution changed another setting that code running here
    surely reads (`cuda_graph_config.decode.max_bs` 256 -> 64, read by the decode graph capture),
    that reader is on and the running reader is the evidence. When it changed nothing else, or only
    settings nothing running here reads (`_x_explicitly_set` False -> True, read only by a
    configurator this model never builds), that reader is off: the flag's own value and its other
    readers decide."""
    live = [f for f in v.findings if f.state in ("on", "runtime") and is_config_path(f.location)]
    if not live:
        return
    changed = {k: ba for k, ba in startup.changed.items() if k not in flag_values}
    why = "SGLang's own resolution here changes nothing else: the flag's own value and its readers decide"
    shown: list[tuple[str, Finding]] = []
    all_off = True
    for dest, (before, after) in changed.items():
        probe = CodeVerdict(v.flag, dest, v.version, "unknown", "", 0.3, value=after)
        reader_findings(index, dest, facts, {**flag_values, dest: after}, probe, without)
        running = [f for f in probe.findings if not is_config_path(f.location)]
        if f := _running_reader(index, dest, running, facts, {**flag_values, dest: after}):
            what = f"reads `{dest}`, which SGLang's own resolution here changes with the flag ({_diff(before, after)})"
            shown.append(
                (dest, Finding(f.location, f.text, f.function, "on", what, f.conditions, sure=f.sure))
            )
        if not running or any(f.state != "off" for f in running):
            all_off = False
        else:
            why = f"sets `{dest}` to {after!r} as SGLang resolves it here; every reader of that is off, e.g. {running[0].location}: {running[0].why}"
    if shown:
        for f in live:
            f.state, f.why = (
                "on",
                "ran as SGLang resolved the flag here (its result is in the resolved configuration)",
            )
        words = set(v.dest.split("_"))  # the setting named most like the flag first
        shown.sort(key=lambda s: -len(words & set(s[0].split("_"))))
        v.findings[:0] = [f for _, f in shown[:2]]
    elif all_off:
        for f in live:
            f.state, f.why = "off", why


def _reset_at_startup(v: CodeVerdict, startup: StartupAnswer, dest: str, trial: Any) -> None:
    """SGLang's own resolution here changed other settings but left `dest` where it is without the
    flag (`_handle_data_parallelism` sets `enable_dp_attention` back to False when `dp_size` is 1,
    after two earlier reads of it lowered `mem_fraction_static`): code that runs after start-up
    reads the value it reads without the flag, so those readers, and the refusals they would reach
    with the trial value, are off. What argument code did with the value on its way is in the
    resolved configuration (`_settled_in_argument_code`)."""
    if dest not in startup.baseline or dest in startup.changed or startup.baseline[dest] == trial:
        return
    why = (
        f"SGLang's own resolution here leaves `{dest}` at {startup.baseline[dest]!r}, as without the flag: "
        "code that runs after start-up reads what it reads without it"
    )
    for f in v.findings:
        if not is_config_path(f.location) and f.state != "off":
            f.state, f.why, f.exits = "off", why, []


def _running_reader(
    index: FlagIndex, dest: str, found: list[Finding], facts: dict[str, Any], values: dict[str, Any]
) -> Finding | None:
    """The reader of `dest` among `found` that best shows it acting here: on here (its module
    loaded, its conditions hold); one a chain of callers surely reaches first (of the first eight),
    then the one whose file is named like the setting (`cuda_graph_config` ->
    `.../cuda_graph_config.py`)."""
    on = [f for f in found if f.state == "on" and not f.alternative and not is_validator(f)]
    words = set(dest.split("_"))
    on.sort(key=lambda f: -len(words & set(re.split(r"[/_.]", f.location))))
    for f in on[:8]:
        func = index.func(f.location.rsplit(":", 1)[0], f.function)
        if f.sure or (func is not None and reached(index, func, facts, values)):
            f.sure = True
            return f
    return on[0] if on else None


def _diff(before: Any, after: Any, at: str = "", limit: int = 3) -> str:
    """What changed between two resolved values, briefly: `decode.max_bs 256 -> 64, ...`."""
    if isinstance(before, dict) and isinstance(after, dict):
        keys = [k for k in {**before, **after} if before.get(k) != after.get(k)]
        parts = [_diff(before.get(k), after.get(k), f"{at}{k}.", limit) for k in keys[:limit]]
        return ", ".join(parts) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")
    text = f"{at.rstrip('.')} {before!r} -> {after!r}".strip()
    return text if len(text) <= 120 else text[:117] + "..."


def _drop_argument_refusals(v: CodeVerdict) -> None:
    """SGLang's own resolution accepted the flag here: a `raise`/`assert` the code walk reached in
    argument code did not fire."""
    for f in v.findings:
        f.exits = [e for e in f.exits if not (e.kind in ("raise", "assert") and is_config_path(e.location))]


def _changes(startup: StartupAnswer, limit: int = 6) -> str:
    items = [f"{k} {before!r} -> {after!r}" for k, (before, after) in list(startup.changed.items())[:limit]]
    more = len(startup.changed) - limit
    return ", ".join(items) + (f" and {more} more" if more > 0 else "")
