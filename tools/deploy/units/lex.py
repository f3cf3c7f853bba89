"""Lexers for `tools.deploy.units.file`: systemd unit lines and words, and POSIX shell launch scripts.

Every word records the byte span it came from in the original text, which is what lets
`UnitFile` edit one flag and leave every other byte as it was.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_SIMPLE_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", '"': '"', "'": "'", "s": " ", " ": " ", ";": ";",
}  # fmt: skip
_LAUNCH = re.compile(r"(^|[./])launch_server$")
_OPERATORS = ";&|<>()"
_SHELL_EXPANSION = re.compile(r"[A-Za-z_{(@*#?!0-9-]")


class UnitFileError(ValueError):
    """A unit file or value that cannot be used safely; the message says where and why."""


@dataclass(frozen=True)
class Word:
    """One unquoted word and the `[start, end)` byte span it was read from."""

    value: str
    start: int
    end: int
    parts: tuple[tuple[str, str], ...] = ()
    """("lit", text) and ("var", name) (`${NAME}`) / ("splitvar", name) (`$NAME`, a word of its own)
    pieces for systemd's `$` expansion; ("split", "$") for a shell word with an unquoted expansion."""


@dataclass(frozen=True)
class Entry:
    """One `Key=value` of a unit, continuation lines joined (a backslash-newline reads as a space)."""

    section: str
    key: str
    value: str
    line: int
    offsets: tuple[int, ...]
    """Original byte offset of each character of `value`."""
    multiline: bool = False
    last_indent: str = ""
    prefix: str = ""


def _physical_lines(text: str) -> list[tuple[int, int]]:
    lines, pos = [], 0
    while pos < len(text):
        nl = text.find("\n", pos)
        end = len(text) if nl < 0 else nl
        content_end = end - 1 if end > pos and text[end - 1] == "\r" else end
        lines.append((pos, content_end))
        pos = end + 1
    return lines


def _continues(content: str) -> bool:
    return (len(content) - len(content.rstrip("\\"))) % 2 == 1


def parse_entries(text: str) -> list[Entry]:
    """All `Key=value` entries of a systemd unit, with section names; malformed lines are errors."""
    lines = _physical_lines(text)
    entries: list[Entry] = []
    section: str | None = None
    i = 0
    while i < len(lines):
        start, end = lines[i]
        no = i + 1
        stripped = text[start:end].strip()
        i += 1
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("["):
            if not stripped.endswith("]") or not _KEY.match(stripped[1:-1]):
                raise UnitFileError(f"line {no}: malformed section header {stripped!r}")
            section = stripped[1:-1]
            continue
        if section is None:
            raise UnitFileError(f"line {no}: {stripped!r} is outside of any [Section]")
        chars: list[str] = []
        offsets: list[int] = []
        seg_start, seg_end, multiline = start, end, False
        while True:
            content = text[seg_start:seg_end].rstrip(" \t")
            cont = _continues(content)
            body = content[:-1] if cont else content
            chars.extend(body)
            offsets.extend(range(seg_start, seg_start + len(body)))
            if not cont:
                break
            chars.append(" ")
            offsets.append(seg_start + len(body))
            while i < len(lines) and text[lines[i][0] : lines[i][1]].lstrip()[:1] in ("#", ";"):
                i += 1  # systemd skips comment lines inside a continuation
            if i >= len(lines):
                break
            seg_start, seg_end = lines[i]
            multiline = True
            i += 1
        logical = "".join(chars)
        if "=" not in logical:
            raise UnitFileError(f"line {no}: expected Key=value, got {stripped!r}")
        key, _, rest = logical.partition("=")
        key = key.strip()
        if not _KEY.match(key):
            raise UnitFileError(f"line {no}: malformed key {key!r}")
        lead = len(logical) - len(rest) + (len(rest) - len(rest.lstrip()))
        value = logical[lead:].rstrip()
        indent_src = text[seg_start:seg_end]
        indent = indent_src[: len(indent_src) - len(indent_src.lstrip())]
        entries.append(
            Entry(section, key, value, no, tuple(offsets[lead : lead + len(value)]), multiline, indent)
        )
    return entries


def find_exec_start(entries: Sequence[Entry]) -> Entry:
    """The service's single `ExecStart=`, honoring empty resets; its `-@:+!` prefix split off."""
    found: list[Entry] = []
    for e in entries:
        if e.section == "Service" and e.key == "ExecStart":
            found = [] if not e.value else [*found, e]
    if not found:
        raise UnitFileError("no ExecStart= in the [Service] section")
    if len(found) > 1:
        raise UnitFileError(
            f"{len(found)} ExecStart= lines (lines {found[0].line}, {found[1].line}); expected one"
        )
    e = found[0]
    n = len(e.value) - len(e.value.lstrip("-@:+!"))
    if n == len(e.value):
        raise UnitFileError(f"line {e.line}: ExecStart= has no command")
    return Entry(
        e.section, e.key, e.value[n:], e.line, e.offsets[n:], e.multiline, e.last_indent, e.value[:n]
    )


def environment_entries(entries: Sequence[Entry]) -> list[Entry]:
    """The service's `Environment=` entries in order, honoring empty resets."""
    found: list[Entry] = []
    for e in entries:
        if e.section == "Service" and e.key == "Environment":
            found = [] if not e.value else [*found, e]
    return found


def entry_words(entry: Entry) -> list[Word]:
    """The `NAME=value` words of an `Environment=` entry."""
    words = _split_systemd(entry, command=False)
    for w in words:
        name, eq, _ = w.value.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise UnitFileError(f"line {entry.line}: Environment= word {w.value!r} is not NAME=value")
    return words


def systemd_words(entry: Entry) -> list[Word]:
    """Split an `ExecStart=` value into words by systemd's quoting rules."""
    return _split_systemd(entry, command=True)


def _unescape(s: str, i: int, line: int) -> tuple[str, int]:
    """Read the C escape at `s[i] == '\\'`; return (text, next index)."""
    if i + 1 >= len(s):
        return "\\", i + 1
    c = s[i + 1]
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], i + 2
    sizes = {"x": (2, 16), "u": (4, 16), "U": (8, 16)}
    if c in sizes:
        n, base = sizes[c]
        digits = s[i + 2 : i + 2 + n]
    elif c in "01234567":
        n, base, digits = 3, 8, s[i + 1 : i + 4]
        i -= 1
    else:
        return "\\" + c, i + 2  # systemd keeps unknown escapes (relaxed mode)
    try:
        code = int(digits, base)
        if len(digits) != n or code == 0:
            raise ValueError
        return chr(code), i + 2 + n
    except ValueError:
        raise UnitFileError(f"line {line}: bad escape sequence \\{c}{digits}") from None


def _split_systemd(entry: Entry, *, command: bool) -> list[Word]:
    s, offs, words, i = entry.value, entry.offsets, [], 0
    while True:
        while i < len(s) and s[i] in " \t":
            i += 1
        if i >= len(s):
            return words
        if command and s[i] == ";" and (i + 1 == len(s) or s[i + 1] in " \t"):
            raise UnitFileError(f"line {entry.line}: ';' separates a second command; only one is supported")
        start, quote, parts, buf, dollar_first = i, None, [], [], False
        while i < len(s) and (quote or s[i] not in " \t"):
            c = s[i]
            if c == quote:
                quote, i = None, i + 1
            elif quote is None and c in "'\"":
                quote, i = c, i + 1
            elif c == "\\":
                text, i = _unescape(s, i, entry.line)
                buf.append(text)
            elif s.startswith("%%", i) or (command and s.startswith("$$", i)):
                buf.append(c)  # systemd's specifier escape (everywhere) and `$$` (command lines)
                i += 2
            elif command and c == "$" and s[i + 1 : i + 2] != "{" and not parts and not "".join(buf):
                dollar_first = True  # systemd reads the whole word as one variable name
                m = _VAR.match(s, i)
                parts.append(("bvar", m.group(2)) if m else ("lit", c))
                i = m.end() if m else i + 1
            elif command and (m := _VAR.match(s, i)):
                parts.append(("lit", "".join(buf)))
                buf = []
                parts.append(("var", m.group(1)) if m.group(1) else ("lit", m.group(0)))
                i = m.end()
            else:
                buf.append(c)
                i += 1
        if quote:
            raise UnitFileError(f"line {entry.line}: unterminated {quote} quote")
        parts = [p for p in [*parts, ("lit", "".join(buf))] if p[1]]
        if dollar_first:
            parts = _whole_word_variable(parts, s[start:i], entry.line)
        value = "".join(_shown(k, t) for k, t in parts)
        words.append(Word(value, offs[start], offs[i - 1] + 1, tuple(parts)))


def _whole_word_variable(parts: list[tuple[str, str]], raw: str, line: int) -> list[tuple[str, str]]:
    """A word that starts with `$` (not `${` or `$$`): systemd takes all of it, after unquoting, as
    one variable name and splits that variable's value into words (systemd.service(5), "Command
    lines"); anything else after the name makes it no variable at all: refused, as systemd drops it."""
    if len(parts) == 1 and parts[0][0] == "bvar":
        return [("splitvar", parts[0][1])]
    raise UnitFileError(
        f"line {line}: the word {raw!r} starts with $, so systemd reads all of it as one variable name, "
        "which it is not (the word would vanish); write ${NAME} to put a variable inside a word, or $$ "
        "for a literal $"
    )


def _shown(kind: str, text: str) -> str:
    return {"lit": text, "var": "${" + text + "}", "splitvar": "$" + text}.get(kind, text)


def split_value(value: str) -> list[str]:
    """The words a `$VAR` word becomes: the value split at whitespace, quotes respected and removed,
    a backslash taking the next character as it is (systemd's EXTRACT_UNQUOTE | EXTRACT_RELAX)."""
    words: list[str] = []
    buf, in_word, quote, i = [], False, "", 0
    while i < len(value):
        c = value[i]
        i += 1
        if c == "\\" and i < len(value):
            buf.append(value[i])
            in_word, i = True, i + 1
        elif quote:
            if c == quote:
                quote = ""
            else:
                buf.append(c)
        elif c in "'\"":
            quote, in_word = c, True
        elif c in " \t\n\r":
            if in_word:
                words.append("".join(buf))
            buf, in_word = [], False
        else:
            buf.append(c)
            in_word = True
    if in_word:
        words.append("".join(buf))
    return words


def quote_value_word(word: str) -> str:
    """One word of a `$VAR` value, written so that `split_value` gives it back whole."""
    if word and re.fullmatch(r"[A-Za-z0-9_@+=:,./%-]+", word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def expand(word: Word, env: Mapping[str, str]) -> list[str]:
    """The argv words a systemd word becomes: `$VAR` alone splits (`split_value`), `${VAR}` does not;
    an unset `$VAR` gives no word, an unset `${VAR}` the empty string."""
    if not word.parts:
        return [word.value]
    if len(word.parts) == 1 and word.parts[0][0] == "splitvar":
        name = word.parts[0][1]
        return split_value(env[name]) if name in env else []
    return ["".join(env.get(t, "") if k == "var" else t for k, t in word.parts)]


def _shell_words(text: str) -> list[list[Word]]:
    """Split a shell script into simple commands (lists of words); operators end a command. One piece
    because it is one hand-written scanner: a single index and quote state walk the text once."""
    commands: list[list[Word]] = [[]]
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t" or text.startswith("\\\n", i):
            i += 2 if c == "\\" else 1
            continue
        if c == "\n" or c in _OPERATORS:
            last = commands[-1][-1] if commands[-1] else None
            if last and c in "<>" and last.end == i and re.fullmatch(r"\d+", last.value):
                commands[-1].pop()  # `2>&1`: the fd number is not an argument
            commands.append([])
            i += 1
            continue
        if c == "#":
            i = text.find("\n", i)
            i = n if i < 0 else i
            continue
        start, buf, quote, splits = i, [], None, False
        while i < n:
            c = text[i]
            if quote is None:
                splits = splits or c == "`" or (c == "$" and _SHELL_EXPANSION.match(text, i + 1) is not None)
            elif quote == '"':
                splits = splits or text.startswith(("$@", "${@"), i)
            if quote == "'":
                if c == "'":
                    quote = None
                else:
                    buf.append(c)
                i += 1
            elif c == "\\":
                nxt = text[i + 1 : i + 2]
                if nxt == "\n":
                    i += 2
                elif quote == '"' and nxt not in ('"', "\\", "$", "`"):
                    buf.append(c)
                    i += 1
                else:
                    buf.append(nxt)
                    i += 2
            elif quote == '"':
                if c == '"':
                    quote = None
                else:
                    buf.append(c)
                i += 1
            elif c in "'\"":
                quote, i = c, i + 1
            elif c in " \t\n" or c in _OPERATORS:
                break
            else:
                buf.append(c)
                i += 1
        if quote:
            raise UnitFileError(f"unterminated {quote} quote in the script")
        # An unquoted expansion becomes any number of words once the shell splits it.
        commands[-1].append(Word("".join(buf), start, i, (("split", "$"),) if splits else ()))
    return [c for c in commands if c]


def script_command(text: str) -> tuple[list[Word], list[Word], bool, str]:
    """Find the `launch_server` command of a script: (words, leading assignments, multiline, indent)."""
    for words in _shell_words(text):
        if not any(_LAUNCH.search(w.value) for w in words):
            continue
        k, assigns = 0, []
        while k < len(words) and (
            words[k].value == "exec" or re.match(r"[A-Za-z_][A-Za-z0-9_]*=", words[k].value)
        ):
            if words[k].value != "exec":
                assigns.append(words[k])
            k += 1
        cmd = words[k:]
        span = text[cmd[0].start : cmd[-1].end]
        last_line_start = text.rfind("\n", 0, cmd[-1].start) + 1
        line = text[last_line_start : cmd[-1].start]
        indent = line[: len(line) - len(line.lstrip())]
        return cmd, assigns, "\\\n" in span, indent
    raise UnitFileError("no `launch_server` command found in the script")
