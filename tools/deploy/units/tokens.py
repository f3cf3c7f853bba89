"""The server command as the arguments the server gets, each knowing the word it came from.

systemd expands variables in `ExecStart=` (systemd.service(5), "Command lines"): a word that is
`$NAME` on its own becomes the variable's value split into words (quotes respected), `${NAME}`
inside a word is replaced by the value as one piece, an unset `$NAME` gives no word at all. The
variables are the unit's `Environment=` and, on the host, its `EnvironmentFile=` files (which win).
So `--mem-fraction-static 0.85 $EXTRA` with `EXTRA=--max-running-requests 64` gives the server four
arguments, two of them from `EXTRA`: a flag is parsed from the arguments, and an edit knows whether
to change a word of `ExecStart=` or a word inside a variable's value.

A `$NAME` whose value is not known here (an `EnvironmentFile=` not read, a variable systemd itself
sets) is an opaque argument: never a flag, never a flag's value, always kept in place.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tools.deploy.units.entry import entry_point_end
from tools.deploy.units.lex import Word, split_value

__all__ = ["FlagSpan", "Token", "command_tokens", "flags_start", "looks_like_option", "parse_flags"]

_NEGATIVE_NUMBER = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?\Z")


@dataclass(frozen=True)
class Token:
    """One argument: its text, the index of the word it came from and, when that word is `$NAME`,
    the variable and the argument's place in its value."""

    value: str
    word: int
    var: str | None = None
    part: int = -1
    opaque: bool = False
    """The value is not known here (an unresolved `$NAME`, or a shell expansion in a script)."""


@dataclass(frozen=True)
class FlagSpan:
    """One `--flag [values]` (or `--flag=value`) among the tokens."""

    name: str
    name_index: int
    value_indexes: tuple[int, ...]
    eq_form: bool
    value: str | None
    known: bool = True
    """False when the value is an argument whose words are not known (`--model-path $MODEL` in a
    script): shown as written, never edited (the words may be one value, or more flags)."""

    @property
    def indexes(self) -> tuple[int, ...]:
        return (self.name_index, *self.value_indexes)


def looks_like_option(value: str) -> bool:
    """A word argparse would take for an option (a negative number is a value)."""
    return value.startswith("-") and value != "-" and not _NEGATIVE_NUMBER.match(value)


def command_tokens(words: Sequence[Word], first: int, env: Mapping[str, str]) -> list[Token]:
    """The arguments after the executable (`words[first:]`), variables of `env` expanded."""
    tokens: list[Token] = []
    for i in range(first, len(words)):
        w = words[i]
        kinds = [k for k, _ in w.parts]
        if kinds == ["splitvar"]:
            name = w.parts[0][1]
            if name not in env:
                tokens.append(Token(w.value, i, name, opaque=True))
            else:
                tokens += [Token(t, i, name, j) for j, t in enumerate(split_value(env[name]))]
        elif "split" in kinds:
            tokens.append(Token(w.value, i, opaque=True))
        elif "var" in kinds:
            shown = "".join(env.get(t, "${" + t + "}") if k == "var" else t for k, t in w.parts)
            tokens.append(Token(shown, i))
        else:
            tokens.append(Token(w.value, i))
    return tokens


def flags_start(executable: str, tokens: Sequence[Token]) -> int:
    """Index in `tokens` of the first argument that is the server's own (after its entry point)."""
    return max(0, entry_point_end([executable, *(t.value for t in tokens)]) - 1)


def parse_flags(tokens: Sequence[Token], start: int) -> list[FlagSpan]:
    """The `--flags` among `tokens[start:]`, each with the non-option arguments that follow it."""
    spans: list[FlagSpan] = []
    k = start
    while k < len(tokens):
        t = tokens[k]
        text = t.value
        if t.opaque or not (text.startswith("--") and len(text) > 2):
            k += 1
            continue
        if "=" in text:
            name, value = text.split("=", 1)
            spans.append(FlagSpan(name, k, (), True, value))
            k += 1
            continue
        j = k + 1
        while j < len(tokens) and not tokens[j].opaque and not looks_like_option(tokens[j].value):
            j += 1
        indexes = tuple(range(k + 1, j))
        known = bool(indexes) or j >= len(tokens) or not tokens[j].opaque
        if not known:
            indexes, j = (j,), j + 1
        value = " ".join(tokens[i].value for i in indexes) if indexes else None
        spans.append(FlagSpan(text, k, indexes, False, value, known))
        k = j
    return spans
