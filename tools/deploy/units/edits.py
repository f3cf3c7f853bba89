"""Planning one flag's edit in a unit file or launch script: which bytes change, and nothing else.

A flag written in `ExecStart=` (or the script's command) changes there: only its value's bytes when
they can, else its own words, a flag alone on a continuation line going with its line. A flag that
comes from a `$NAME` word changes inside the value of the `Environment=` that sets `NAME` (the
`$NAME` stays where it is). What cannot be edited that way is refused with the reason: a flag half
inside a variable, a variable set by an `EnvironmentFile=` on the host or used twice, a `$NAME` whose
words are unknown here. `UnitFile.set_flag`/`unset_flag` then re-parse and check the result.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from typing import Protocol

from tools.deploy.units.lex import Entry, UnitFileError, Word, quote_value_word, split_value
from tools.deploy.units.tokens import FlagSpan, Token, looks_like_option

__all__ = ["UnitFile", "arguments", "quote", "set_flag", "unset_flag"]


class UnitFile(Protocol):
    """What an edit reads of a `tools.deploy.units.file.UnitFile` (which imports this module)."""

    text: str
    kind: str
    words: tuple[Word, ...]
    first_arg: int
    env_words: tuple[Word, ...]
    entries: tuple[Entry, ...]
    multiline: bool
    indent: str
    tokens: tuple[Token, ...]
    host_env: tuple[tuple[str, str], ...]
    spans: tuple[FlagSpan, ...]

    @property
    def unknown_words(self) -> list[str]: ...


Value = str | Sequence[str] | None
Edit = tuple[int, Callable[[str], str]]
"""(byte offset it starts at, the change); applied from the last offset to the first."""
_SYSTEMD_SAFE = re.compile(r"[A-Za-z0-9_@+=:,./-]+\Z")


def arguments(flag: str, value: Value, *, eq_form: bool) -> list[str]:
    """The arguments `flag` with `value` becomes (unquoted)."""
    if value is None:
        return [flag]
    if isinstance(value, str):
        return [f"{flag}={value}"] if eq_form or value == "" or looks_like_option(value) else [flag, value]
    return [flag, *value]


def quote(unit: UnitFile, value: str) -> str:
    """One argument written for the file: POSIX shell quoting in a script, systemd's in a unit
    (`$` and `%` doubled, so no value ever reads as a variable or a specifier)."""
    if unit.kind == "script":
        return shlex.quote(value)
    if _SYSTEMD_SAFE.match(value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%")
    return f'"{escaped}"'


def _quote_environment(word: str) -> str:
    """A `NAME=value` word for `Environment=`: C escapes and quotes, `%` doubled; `$` is plain there."""
    if _SYSTEMD_SAFE.match(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%") + '"'


def _refuse_unknown(unit: UnitFile, flag: str) -> None:
    unknown = unit.unknown_words
    if unit.kind == "systemd" and unknown:
        files = " (it may come from an EnvironmentFile= on the host)" if _has_env_files(unit) else ""
        raise UnitFileError(
            f"the server command passes {unknown[0]}, whose words are not known here{files}: it may set "
            f"{flag} too, and an edit that cannot see it could be undone by it. `optagent deploy` reads "
            f"the host's EnvironmentFile= values; elsewhere set {unknown[0][1:]} with Environment= in the unit"
        )


def _has_env_files(unit: UnitFile) -> bool:
    return any(e.section == "Service" and e.key == "EnvironmentFile" for e in unit.entries)


def _home(unit: UnitFile, s: FlagSpan) -> str | None:
    """Where a flag is written: None for words of the command, else the variable it is inside."""
    homes = {unit.tokens[i].var for i in s.indexes}
    if len(homes) == 1:
        return homes.pop()
    names = ", ".join(sorted(f"${h}" for h in homes if h))
    raise UnitFileError(
        f"{s.name} is written partly inside {names} and partly outside it: no edit of that flag can "
        "leave the other words as they are; change it by hand"
    )


def set_flag(unit: UnitFile, flag: str, value: Value) -> tuple[str, set[str]]:
    """The text with `flag` set to `value`, and the variables whose value changed."""
    _refuse_unknown(unit, flag)
    old = [s for s in unit.spans if s.name == flag]
    if not old:
        at = unit.words[-1].end
        sep = f" \\\n{unit.indent}" if unit.multiline else " "
        new = " ".join(quote(unit, a) for a in arguments(flag, value, eq_form=False))
        return unit.text[:at] + sep + new + unit.text[at:], set()
    return _apply(unit, old, old[0], value)


def unset_flag(unit: UnitFile, flag: str) -> tuple[str, set[str]]:
    """The text without any occurrence of `flag`, and the variables whose value changed."""
    _refuse_unknown(unit, flag)
    return _apply(unit, [s for s in unit.spans if s.name == flag], None, None)


def _apply(
    unit: UnitFile, spans: list[FlagSpan], keep: FlagSpan | None, value: Value
) -> tuple[str, set[str]]:
    """Replace `keep` (if any) by `flag value`, remove the other `spans`."""
    for s in spans:
        if not s.known:
            raise UnitFileError(
                f"{s.name} takes its value from {s.value}, whose words are not known here (one value, or "
                "more flags): change it by hand"
            )
    planned: list[Edit] = []
    by_var: dict[str, list[FlagSpan]] = {}
    for s in spans:
        home = _home(unit, s)
        if home is not None:
            by_var.setdefault(home, []).append(s)
        elif s is keep:
            planned.append((_start(unit, s), lambda text, s=s: _replace(unit, text, s, value)))
        else:
            planned.append((_start(unit, s), lambda text, s=s: _cut(unit, text, s)))
    for var, in_var in by_var.items():
        planned.append(_variable_edit(unit, var, in_var, keep, value))
    text = unit.text
    for _, change in sorted(planned, key=lambda e: e[0], reverse=True):
        text = change(text)  # the last first: offsets before it stay valid
    return text, set(by_var)


def _start(unit: UnitFile, s: FlagSpan) -> int:
    return unit.words[unit.tokens[s.name_index].word].start


def _end(unit: UnitFile, s: FlagSpan) -> int:
    return unit.words[unit.tokens[s.indexes[-1]].word].end


def _replace(unit: UnitFile, text: str, s: FlagSpan, value: Value) -> str:
    simple = isinstance(value, str) and value != "" and not looks_like_option(value)
    if not s.eq_form and len(s.value_indexes) == 1 and simple:
        w = unit.words[unit.tokens[s.value_indexes[0]].word]  # only the value's bytes change
        return text[: w.start] + quote(unit, value) + text[w.end :]
    eq = s.eq_form and isinstance(value, str)
    new = " ".join(quote(unit, a) for a in arguments(s.name, value, eq_form=eq))
    return text[: _start(unit, s)] + new + text[_end(unit, s) :]


def _cut(unit: UnitFile, text: str, s: FlagSpan) -> str:
    # From the end of the previous word, so a flag on its own continuation line goes whole.
    start, end = _start(unit, s), _end(unit, s)
    line_start = text.rfind("\n", 0, start) + 1
    tail = re.match(r"[ \t]*\\\r?\n", text[end:])
    if text[line_start:start].strip() == "" and tail:
        start, end = line_start, end + tail.end()  # the flag has its own continuation line
    else:
        start = unit.words[unit.tokens[s.name_index].word - 1].end
    return text[:start] + text[end:]


def _defining_word(unit: UnitFile, var: str) -> Word:
    """The `Environment=` word whose value the server gets for `var` (the last one that sets it)."""
    refs = [w for w in unit.words[unit.first_arg :] if w.parts == (("splitvar", var),)]
    if len(refs) != 1:
        raise UnitFileError(
            f"${var} is used {len(refs)} times in the command: editing a flag inside it would change "
            "every place; change it by hand"
        )
    if var in dict(unit.host_env):
        raise UnitFileError(
            f"the flags in ${var} come from an EnvironmentFile= on the host, which optagent does not edit: "
            f"change the flag there, or set {var} with Environment= in the unit"
        )
    found = [w for w in unit.env_words if w.value.split("=", 1)[0] == var]
    if not found:
        raise UnitFileError(f"${var} is not set by Environment= in the unit; cannot edit a flag inside it")
    return found[-1]


def _variable_edit(
    unit: UnitFile, var: str, spans: list[FlagSpan], keep: FlagSpan | None, value: Value
) -> Edit:
    """Rewrite the `Environment=` word of `var`: `keep` replaced, the other spans removed."""
    word = _defining_word(unit, var)
    items = split_value(word.value.split("=", 1)[1])
    drop: set[int] = set()
    put: dict[int, list[str]] = {}
    for s in spans:
        parts = [unit.tokens[i].part for i in s.indexes]
        if s is keep:
            put[parts[0]] = arguments(s.name, value, eq_form=s.eq_form and isinstance(value, str))
            drop.update(parts[1:])
        else:
            drop.update(parts)
    new: list[str] = []
    for j, item in enumerate(items):
        new += put.get(j, [] if j in drop else [item])
    text = _quote_environment(f"{var}={' '.join(quote_value_word(x) for x in new)}")
    return word.start, lambda t: t[: word.start] + text + t[word.end :]
