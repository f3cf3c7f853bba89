"""The flag catalog from argparse `--help` output (`parse_help_text`), and the one a target's own
`launch_server --help` prints (`catalog_from_host`); the records are `tools.research.catalog`'s."""

from __future__ import annotations

import re
from typing import Any

from tools.research.catalog import FlagInfo, deprecation_of

_OPTION_RE = re.compile(r"^  (-{1,2}[\w][\w.-]*.*?)(?:\s{2,}(\S.*))?$")


def parse_help_text(text: str) -> list[FlagInfo]:
    """Flags from argparse `--help` output (`python -m sglang.launch_server --help`)."""
    flags: list[FlagInfo] = []
    current: FlagInfo | None = None
    in_options = False
    for line in text.splitlines():
        if line and not line.startswith(" "):
            in_options = line.rstrip().endswith(":") and not line.startswith("usage:")
            current = None
            continue
        if not in_options:
            continue
        m = _OPTION_RE.match(line)
        if m and not line.startswith("   "):
            current = _help_option(m.group(1), m.group(2) or "")
            if current is not None:
                flags.append(current)
            continue
        if current is not None and line.strip():
            # argparse wraps at hyphens too: "--x-\n  backend" is one word.
            glue = "" if current.help.endswith("-") and not current.help.endswith(" -") else " "
            current.help = (current.help + glue + line.strip()).strip()
    for f in flags:
        m = re.search(r"\(default: ([^)]*)\)", f.help)
        if m:
            f.default = m.group(1)
        f.deprecated, f.replacement = deprecation_of(f.help, None, None)
    return [f for f in flags if f.name != "--help"]


def _help_option(invocation: str, help_text: str) -> FlagInfo | None:
    names, metavar, choices = [], None, None
    for part in re.split(r",\s+(?=-)", invocation.strip()):
        opt, _, rest = part.partition(" ")
        names.append(opt)
        rest = rest.strip()
        if rest.startswith("{") and "}" in rest:
            choices = rest[1 : rest.index("}")].split(",")
        elif rest:
            metavar = rest
    longs = [n for n in names if n.startswith("--")]
    if not longs:
        return None
    is_flag = metavar is None and choices is None
    return FlagInfo(
        name=longs[0],
        dest=longs[0][2:].replace("-", "_"),
        type="bool" if is_flag else ("list" if metavar and "..." in metavar else "str"),
        default=False if is_flag else None,
        choices=choices,
        help=help_text.strip(),
        aliases=[n for n in names if n != longs[0]],
    )


async def catalog_from_host(
    transport: Any, python: str = "python3", *, timeout: float = 180
) -> list[FlagInfo]:
    """The catalog the target's own `launch_server --help` prints (authoritative for that install)."""
    result = await transport.run([python, "-m", "sglang.launch_server", "--help"], timeout=timeout)
    flags = parse_help_text(result.stdout) if result.returncode == 0 else []
    if not flags:
        tail = (result.stderr or result.stdout).strip()[-300:]
        raise RuntimeError(
            f"`{python} -m sglang.launch_server --help` failed (exit {result.returncode}): {tail}"
        )
    return flags
