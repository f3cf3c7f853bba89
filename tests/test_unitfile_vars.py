"""systemd variables and wrappers in the server command (issue 52, item 4).

What each case expects comes from systemd.service(5), "Command lines": a word that is `$NAME` on its
own becomes the variable's value split at whitespace (quotes respected, then removed: the unit's own
quotes around the word do not stop it), `${NAME}` is replaced by the value as one piece, a `$NAME`
inside a longer word is left as it is (only the braced form expands there), `$$` is a literal `$`.
`Environment=` sets the variables (`$` has no meaning inside its values); `EnvironmentFile=` values,
read on the host, win over it. The server's flags are those after its entry point, whatever wrappers
(`taskset`, `numactl`, `nice`, `env`, `docker run ... IMAGE`) come before it.
"""

from __future__ import annotations

import textwrap

import pytest

from tools.deploy.units.file import UnitFile, UnitFileError

EXTRA = textwrap.dedent(
    """\
    [Service]
    Environment="EXTRA=--cuda-graph-max-bs-decode 32 --max-running-requests 64" OTHER=1
    ExecStart=/opt/venv/bin/python -m sglang.launch_server \\
        --model-path /m \\
        --mem-fraction-static 0.85 $EXTRA
    """
)
SERVER_ARGS = ["--model-path", "/m", "--mem-fraction-static", "0.85",
               "--cuda-graph-max-bs-decode", "32", "--max-running-requests", "64"]  # fmt: skip


def _server_args(unit: UnitFile) -> list[str]:
    return unit.exec_argv()[3:]


def test_a_variable_alone_is_split_into_the_server_s_arguments() -> None:
    unit = UnitFile.parse(EXTRA)
    assert _server_args(unit) == SERVER_ARGS
    assert unit.command.flags == {
        "--model-path": "/m",
        "--mem-fraction-static": "0.85",  # not "0.85 $EXTRA"
        "--cuda-graph-max-bs-decode": "32",
        "--max-running-requests": "64",
    }
    quoted = UnitFile.parse(EXTRA.replace(" $EXTRA", ' "$EXTRA"'))  # unquoted first, then split
    assert _server_args(quoted) == SERVER_ARGS
    braced = UnitFile.parse(EXTRA.replace(" $EXTRA", " --x ${EXTRA}"))  # one argument, spaces and all
    assert _server_args(braced)[-2:] == ["--x", "--cuda-graph-max-bs-decode 32 --max-running-requests 64"]
    inside = UnitFile.parse(EXTRA.replace(" $EXTRA", " --served-model-name=$OTHER"))  # not expanded
    assert inside.command.flags["--served-model-name"] == "$OTHER"
    assert _server_args(inside)[-1] == "--served-model-name=$OTHER"
    values = UnitFile.parse(
        EXTRA.replace('"EXTRA=', "\"EXTRA='--chat-template' 'a b' ").replace("OTHER=1", "")
    )
    assert values.command.flags["--chat-template"] == "a b"


def test_editing_a_flag_beside_a_variable_keeps_the_variable() -> None:
    unit = UnitFile.parse(EXTRA)
    edited = unit.set_flag("--mem-fraction-static", "0.8")
    assert edited.render() == EXTRA.replace("0.85 $EXTRA", "0.8 $EXTRA")
    assert _server_args(edited) == [*SERVER_ARGS[:3], "0.8", *SERVER_ARGS[4:]]
    added = unit.set_flag("--enable-mixed-chunk")
    assert _server_args(added) == [*SERVER_ARGS, "--enable-mixed-chunk"]
    removed = unit.unset_flag("--mem-fraction-static")
    assert _server_args(removed) == [*SERVER_ARGS[:2], *SERVER_ARGS[4:]]
    assert "$EXTRA" in removed.render()


def test_a_flag_inside_a_variable_is_edited_in_its_environment_line() -> None:
    unit = UnitFile.parse(EXTRA)
    edited = unit.set_flag("--max-running-requests", "128")
    assert edited.render() == EXTRA.replace("requests 64", "requests 128")  # ExecStart= untouched
    assert _server_args(edited) == [*SERVER_ARGS[:-1], "128"]
    assert edited.environment["OTHER"] == "1"
    gone = unit.unset_flag("--cuda-graph-max-bs-decode")
    assert gone.render() == EXTRA.replace("--cuda-graph-max-bs-decode 32 ", "")
    spaced = unit.set_flag("--max-running-requests", "a b")  # quoted inside the value, still one argument
    assert _server_args(spaced)[-2:] == ["--max-running-requests", "a b"]
    assert _server_args(UnitFile.parse(spaced.render()))[-2:] == ["--max-running-requests", "a b"]


def test_what_cannot_be_edited_in_place_is_refused_with_the_reason() -> None:
    from_file = UnitFile.parse(
        EXTRA.replace("[Service]\n", "[Service]\nEnvironmentFile=/etc/sglang.env\n").replace(
            '"EXTRA=--cuda-graph-max-bs-decode 32 --max-running-requests 64" ', ""
        ),
        env={"EXTRA": "--max-running-requests 64"},
    )
    assert from_file.command.flags["--max-running-requests"] == "64"
    with pytest.raises(UnitFileError, match="EnvironmentFile= on the host"):
        from_file.set_flag("--max-running-requests", "32")
    assert "$EXTRA" in from_file.set_flag("--mem-fraction-static", "0.8").render()
    beside_a_file = UnitFile.parse(  # EXTRA set in the unit, another variable from the host's file
        EXTRA.replace("[Service]\n", "[Service]\nEnvironmentFile=/etc/sglang.env\n").replace(
            "$EXTRA", "$EXTRA $MORE"
        ),
        env={"MORE": "--enable-mixed-chunk"},
    )
    assert beside_a_file.command.flags["--enable-mixed-chunk"] is None
    assert "requests 32" in beside_a_file.set_flag("--max-running-requests", "32").render()
    unknown = UnitFile.parse(
        EXTRA.replace('"EXTRA=--cuda-graph-max-bs-decode 32 --max-running-requests 64" ', "")
    )
    assert unknown.command.flags["--mem-fraction-static"] == "0.85"  # never "$EXTRA"
    with pytest.raises(UnitFileError, match=r"passes \$EXTRA, whose words are not known here"):
        unknown.set_flag("--mem-fraction-static", "0.8")
    half = UnitFile.parse(EXTRA.replace("--mem-fraction-static 0.85 $EXTRA", "--max-running-requests $EXTRA")
                          .replace("EXTRA=--cuda-graph-max-bs-decode 32 --max-running-requests 64",
                                   "EXTRA=64 --cuda-graph-max-bs-decode 32"))  # fmt: skip
    assert half.command.flags["--max-running-requests"] == "64"
    with pytest.raises(UnitFileError, match="partly inside"):
        half.set_flag("--max-running-requests", "8")
    with pytest.raises(UnitFileError, match="one variable name"):
        UnitFile.parse(EXTRA.replace("$EXTRA", "$EXTRA.x"))


@pytest.mark.parametrize(
    "wrapped",
    [
        "/usr/bin/taskset --cpu-list 0-1 /opt/venv/bin/optagent-sim launch_server",
        "/usr/bin/taskset -c 0,1 /opt/venv/bin/python3 -m sglang.launch_server",
        "/usr/bin/numactl --membind=0 --cpunodebind 0 /usr/bin/nice -n 5 /opt/venv/bin/sglang serve",
        "/usr/bin/env -u DEBUG CUDA_VISIBLE_DEVICES=0 /opt/venv/bin/my-server",
        "/usr/bin/ionice -c 2 -n 0 /usr/bin/chrt -o 0 /opt/run-sglang",
        "/usr/bin/docker run --rm --gpus all -e HF_HOME=/hf -v /m:/m --name sgl lmsysorg/sglang:v0.5.23",
    ],
)
def test_a_wrapper_s_options_are_never_server_flags(wrapped: str) -> None:
    unit = UnitFile.parse(f"[Service]\nExecStart={wrapped} --model-path /m --tp 2\n")
    assert unit.command.flags == {"--model-path": "/m", "--tp": "2"}
    edited = unit.set_flag("--tp", "4")
    assert edited.render() == f"[Service]\nExecStart={wrapped} --model-path /m --tp 4\n"


def test_a_script_s_expansions_are_kept_in_place() -> None:
    script = '#!/bin/sh\nexec python3 -m sglang.launch_server --mem-fraction-static 0.85 $EXTRA "$@"\n'
    unit = UnitFile.parse(script)
    assert unit.command.flags == {"--mem-fraction-static": "0.85"}
    edited = unit.set_flag("--mem-fraction-static", "0.8").set_flag("--tp", "2")
    assert edited.render() == script.replace('0.85 $EXTRA "$@"', '0.8 $EXTRA "$@" --tp 2')
    switch = UnitFile.parse(script.replace("--mem-fraction-static 0.85", "--enable-mixed-chunk"))
    assert switch.command.flags == {"--enable-mixed-chunk": "$EXTRA"}  # as written: its words are unknown
    with pytest.raises(UnitFileError, match=r"takes its value from \$EXTRA"):
        switch.set_flag("--enable-mixed-chunk")  # never dropped with the switch
    assert "$EXTRA" in switch.set_flag("--tp", "2").render()
