"""Text from the user or the host made safe to show on a terminal.

A goal, a name or a host log line may hold terminal control sequences: ESC [ 2 J clears the screen,
ESC ] 0 ; ... BEL retitles the window, a carriage return draws over the line before it, and bidi
overrides show a text other than the one held. Whatever optagent echoes passes through `printable`
first (the CLI's consoles do so for everything they print: `agent.cli.common.TerminalConsole`).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["json_text", "printable"]

_SEQUENCES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: cursor, erase, colours
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window title, hyperlinks, clipboard
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]?"  # any other escape
    r"|\x9b[0-?]*[ -/]*[@-~]"  # the one-byte CSI
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""C0 but newline and tab, DEL, C1, and the bidi embeddings, overrides and isolates."""


def printable(text: str) -> str:
    """`text` without terminal control sequences and control characters (newlines and tabs kept)."""
    if not _CONTROLS.search(text):
        return text
    return _CONTROLS.sub("", _SEQUENCES.sub("", text))


def json_text(value: Any, **dumps: Any) -> str:
    """`value` as JSON for a terminal or a pipe: non-ASCII text stays readable, while DEL, C1 and the
    bidi controls that `json.dumps(ensure_ascii=False)` leaves raw are written as `\\uXXXX` escapes
    (the same JSON, nothing a terminal acts on; C0 is escaped by `json` itself)."""
    text = json.dumps(value, ensure_ascii=False, **dumps)
    return _CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
