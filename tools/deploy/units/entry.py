"""Where the server's own arguments start in a launch command, and the commands whose flags no
edit can reach (a shell string)."""

from __future__ import annotations

from collections.abc import Sequence

from tools.deploy.units.lex import UnitFileError, Word

SHELLS = ("sh", "bash", "dash", "zsh", "ksh")


def entry_point_end(words: Sequence[Word]) -> int:
    """The index after SGLang's entry point when the command wraps it (`docker run --gpus all IMAGE
    python3 -m sglang.launch_server ...`, `env ... sglang serve ...`): the flags before it are the
    wrapper's, not the server's. 0 when none is named (a script that passes its arguments on)."""
    for i, w in enumerate(words):
        name = w.value.rsplit("/", 1)[-1]
        if name in ("sglang.launch_server", "launch_server.py") or (
            w.value == "serve" and i > 0 and words[i - 1].value.rsplit("/", 1)[-1] == "sglang"
        ):
            return i + 1
    return 0


def refuse_shell_string(words: Sequence[Word], first: int) -> None:
    """A command run as one shell string (`bash -c "... python -m sglang.launch_server --tp 2"`)
    holds the server's flags inside one word: an edit appended to the command would reach the
    shell, not the server. Refused with what to write instead."""
    if words[0].value.rsplit("/", 1)[-1] not in SHELLS:
        return
    options: list[str] = []
    rest = [w.value for w in words[first:]]
    while rest and rest[0].startswith(("-", "+")) and rest[0] != "--":  # the shell's own options
        options.append(rest.pop(0))
        if options[-1] in ("-o", "+o") and rest:  # `-o pipefail` takes a name
            rest.pop(0)
    if any(not o.startswith("--") and "c" in o[1:] for o in options):
        raise UnitFileError(
            f"the server command runs a shell string ({words[0].value} -c ...): optagent edits the server's "
            "flags as words of the command, and the flags inside that string are out of its reach. Make "
            "the command the server itself (python -m sglang.launch_server ...), or a script that ends in "
            '`exec python -m sglang.launch_server "$@"`'
        )
