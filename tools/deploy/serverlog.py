"""What a failed server start said, in one line: the argparse error or the traceback's last line.

SGLang logs its whole `server_args=ServerArgs(...)` (kilobytes on one line) before it fails; showing
that as "the error" hides the one line a human needs. What is returned has no terminal control
sequence in it (`tools.printable`): the host's lines are shown on the user's terminal.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tools.printable import printable

if TYPE_CHECKING:
    from tools.deploy.transport import Transport

__all__ = ["LOG_TAIL_BYTES", "START_MARKER", "error_line", "log_file_tail", "readable_tail"]

START_MARKER = "--- optagent: starting "
"""The line the process manager writes into the log before each start: a log's tail is what follows it."""

LOG_TAIL_BYTES = 256 * 1024
"""How much of a log file's end is read: many times the 40 lines shown, SGLang's argument dump included."""

MAX_LINE = 300
_ARGPARSE = re.compile(r"^[\w./-][\w./ -]{0,60}: error: .+")  # "sglang serve: error: ..." too
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?$")
_TIMESTAMP = re.compile(r"^\[[^\]]{8,40}\]\s*(?:\w+\s+)?")
_DUMP = re.compile(r"\b(server_args|ServerArgs)\s*[=(]")


def _clean(line: str) -> str:
    return _TIMESTAMP.sub("", printable(line).strip())


def error_line(log: str) -> str | None:
    """The server's own reason for failing (argparse error, last exception line), or None."""
    lines = [_clean(x) for x in log.splitlines() if x.strip()]
    for line in reversed(lines):
        if _ARGPARSE.match(line):
            return line
    for line in reversed(lines):
        if _EXCEPTION.match(line) and not _DUMP.search(line):
            return line[:MAX_LINE]
    return None


def readable_tail(log: str, *, lines: int = 20) -> str:
    """The last `lines` lines with the argument dump and other huge lines cut to a short mark
    (and control sequences removed)."""
    out = []
    for line in printable(log).splitlines()[-lines:]:
        if len(line) > MAX_LINE:
            what = "server arguments" if _DUMP.search(line) else "line"
            line = f"{line[:120]}… ({what}, {len(line)} characters, cut)"
        out.append(line)
    return "\n".join(out)


async def log_file_tail(
    transport: Transport, path: str, *, lines: int, max_bytes: int = LOG_TAIL_BYTES
) -> str:
    """The last `lines` lines of the log file `path` since the server's last start, reading at most
    `max_bytes` from its end ('' when there is no log)."""
    try:
        text = await transport.read_tail(path, max_bytes=max_bytes)
    except FileNotFoundError:
        return ""
    last = text.rfind(START_MARKER)
    if last >= 0:
        text = text[text.find("\n", last) + 1 :]
    return "\n".join(text.splitlines()[-lines:])
