"""Where the server's own arguments start in a launch command, the wrappers before it, and the commands
whose flags no edit can reach (a shell string).

A command may run the server through wrappers: `taskset --cpu-list 0-1`, `numactl --membind=0`,
`nice -n 5`, `env A=B`, `ionice`, `chrt`, `stdbuf` (each replaces itself with the command it wraps),
`docker run ... IMAGE` (stays, as the client), then `python -m sglang.launch_server`, `sglang serve`
or a program's `launch_server` subcommand. Every wrapper's options are read by its own rules, so none
is ever taken for a server flag; an option a wrapper table does not know ends the reading (the
server's flags then start after that wrapper's program word, as for any unknown program).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tools.deploy.units.lex import UnitFileError, Word

__all__ = ["EXEC_WRAPPERS", "SHELLS", "entry_point_end", "exec_wrapper_end", "refuse_shell_string"]

SHELLS = ("sh", "bash", "dash", "zsh", "ksh")

# name: (options that take a value, options that do not, positional words before the command)
EXEC_WRAPPERS: dict[str, tuple[frozenset[str], frozenset[str], int]] = {
    "env": (frozenset({"-u", "--unset", "-C", "--chdir"}),
            frozenset({"-i", "--ignore-environment", "-0", "--null", "-v", "--debug", "-"}), 0),
    "nice": (frozenset({"-n", "--adjustment"}), frozenset(), 0),
    "taskset": (frozenset(), frozenset({"-a", "--all-tasks", "-c", "--cpu-list"}), 1),
    "numactl": (frozenset({"-i", "--interleave", "-p", "--preferred", "-m", "--membind", "-N",
                           "--cpunodebind", "-C", "--physcpubind", "-P", "--preferred-many", "-w",
                           "--weighted-interleave"}),
                frozenset({"-l", "--localalloc", "-a", "--all", "-b", "--balancing", "-t", "--strict"}), 0),
    "ionice": (frozenset({"-c", "--class", "-n", "--classdata"}), frozenset({"-t", "--ignore"}), 0),
    "chrt": (frozenset({"-T", "--sched-runtime", "-P", "--sched-period", "-D", "--sched-deadline"}),
             frozenset({"-b", "--batch", "-d", "--deadline", "-f", "--fifo", "-i", "--idle", "-o", "--other",
                        "-r", "--rr", "-R", "--reset-on-fork", "-a", "--all-tasks", "-v", "--verbose"}), 1),
    "stdbuf": (frozenset({"-i", "--input", "-o", "--output", "-e", "--error"}), frozenset(), 0),
}  # fmt: skip
"""Wrappers that replace themselves with the command they wrap (exec): the running process shows
only that command. Their pid-mode options (`taskset -p`, `ionice -p`, `chrt -p`) are not wrapping."""


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_DOCKER_VALUE = _words(
    "-a --attach --add-host --annotation --blkio-weight --blkio-weight-device --cap-add --cap-drop "
    "--cgroup-parent --cgroupns --cidfile --cpu-count --cpu-percent --cpu-period --cpu-quota "
    "--cpu-rt-period --cpu-rt-runtime -c --cpu-shares --cpus --cpuset-cpus --cpuset-mems --detach-keys "
    "--device --device-cgroup-rule --device-read-bps --device-read-iops --device-write-bps "
    "--device-write-iops --dns --dns-option --dns-search --domainname --entrypoint -e --env --env-file "
    "--expose --gpus --group-add --health-cmd --health-interval --health-retries --health-start-period "
    "--health-timeout -h --hostname --ip --ip6 --ipc --isolation --kernel-memory -l --label --label-file "
    "--link --link-local-ip --log-driver --log-opt --mac-address -m --memory --memory-reservation "
    "--memory-swap --memory-swappiness --mount --name --network --net --network-alias --net-alias "
    "--oom-score-adj --pid --pids-limit --platform -p --publish --pull --restart --runtime --security-opt "
    "--shm-size --stop-signal --stop-timeout --storage-opt --sysctl --tmpfs --ulimit -u --user --userns "
    "--uts -v --volume --volume-driver --volumes-from -w --workdir"
)
_DOCKER_FLAG = _words(
    "--rm -d --detach -i --interactive -t --tty --privileged --init -P --publish-all --read-only "
    "--no-healthcheck --oom-kill-disable --sig-proxy -q --quiet --disable-content-trust"
)
_DOCKER_GLOBAL_VALUE = frozenset({"-H", "--host", "--context", "-c", "--config", "-l", "--log-level"})
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?\Z")
_PYTHON_VALUE = frozenset({"-W", "-X", "-Q"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _base(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _options_end(
    values: Sequence[str], i: int, with_value: frozenset[str], plain: frozenset[str]
) -> int | None:
    """The index of the first word after the options starting at `i`; None at an option not known."""
    while i < len(values):
        word = values[i]
        if word == "--":
            return i + 1
        if not word.startswith("-") or (word == "-" and "-" not in plain):
            return i
        name = word.split("=", 1)[0] if word.startswith("--") else word[:2]
        if word in plain:
            i += 1
        elif name in with_value:
            attached = "=" in word if word.startswith("--") else len(word) > 2
            i += 1 if attached else 2
        elif not word.startswith("--") and all(f"-{c}" in plain for c in word[1:]):
            i += 1  # clustered short options: `-it`
        else:
            return None
    return i


def exec_wrapper_end(values: Sequence[str], i: int) -> tuple[int, dict[str, str]] | None:
    """For the exec wrapper at `values[i]`: (index of the command it runs, variables it sets); None
    when `values[i]` is no such wrapper or its options cannot be read."""
    if i >= len(values) or _base(values[i]) not in EXEC_WRAPPERS:
        return None
    name = _base(values[i])
    with_value, plain, positional = EXEC_WRAPPERS[name]
    j = i + 1
    if name == "nice" and j < len(values) and re.fullmatch(r"-\d+", values[j]):
        j += 1  # the old `nice -5 command`
    end = _options_end(values, j, with_value, plain)
    if end is None:
        return None
    env: dict[str, str] = {}
    if name == "env":
        while end < len(values) and _ASSIGNMENT.match(values[end]):
            key, _, value = values[end].partition("=")
            env[key] = value
            end += 1
    end += positional
    return (end, env) if end < len(values) else None


def _docker_image(values: Sequence[str], i: int) -> int | None:
    """The index of the image in `docker|podman [global options] [container] run [options] IMAGE`."""
    j = _options_end(values, i + 1, _DOCKER_GLOBAL_VALUE, frozenset({"-D", "--debug", "--tls"}))
    if j is not None and j < len(values) and values[j] == "container":
        j += 1
    if j is None or j >= len(values) or values[j] != "run":
        return None
    image = _options_end(values, j + 1, _DOCKER_VALUE, _DOCKER_FLAG)
    return image if image is not None and image < len(values) else None


def _explicit_entry(values: Sequence[str]) -> int:
    for i, value in enumerate(values):
        name = _base(value)
        if name in ("sglang.launch_server", "launch_server.py") or (
            value == "serve" and i > 0 and _base(values[i - 1]) == "sglang"
        ):
            return i + 1
    return 0


def entry_point_end(values: Sequence[str]) -> int:
    """The index after SGLang's entry point in a command (its words as the process gets them): after
    `python3 -m sglang.launch_server`, `sglang serve`, `PROGRAM launch_server` or, for a program not
    known, after that program, with every wrapper before it read by its own rules. 0 for an empty
    command."""
    if explicit := _explicit_entry(values):
        return explicit
    i = 0
    while i < len(values):
        name = _base(values[i])
        if (peeled := exec_wrapper_end(values, i)) is not None:
            i = peeled[0]
        elif name in ("docker", "podman") and (image := _docker_image(values, i)) is not None:
            if image + 1 >= len(values) or values[image + 1].startswith("-"):
                return image + 1  # the image's own entry point is the server
            i = image + 1
        elif _PYTHON.match(name):
            return _python_end(values, i)
        else:
            return i + 2 if values[i + 1 : i + 2] == ["launch_server"] else i + 1
    return i


def _python_end(values: Sequence[str], i: int) -> int:
    """After `python [options] -m MODULE`, `-c COMMAND` or `SCRIPT`: what follows is the program's."""
    j = i + 1
    while j < len(values) and values[j].startswith("-") and values[j] != "-":
        word = values[j]
        if word in ("-m", "-c"):
            return j + 2
        if word.startswith(("-m", "-c")):
            return j + 1  # `-msglang.launch_server`
        j += 2 if word in _PYTHON_VALUE else 1
    return j + 1


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
