"""Unit files and launch scripts: faithful parsing, byte-exact edits, hostile values refused or quoted."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tools.deploy.units.file import UnitFile, UnitFileError, unified_diff

UNIT = textwrap.dedent(
    """\
    # /etc/systemd/system/sglang-qwen.service
    [Unit]
    Description=SGLang Qwen3.5 ; not a comment
    After=network-online.target

    [Service]
    ; a comment
    Environment=CUDA_VISIBLE_DEVICES=0,1,2,3
    Environment="HF_HOME=/data/hf cache" NCCL_DEBUG=WARN
    WorkingDirectory=-/opt/sglang
    ExecStart=-/opt/venv/bin/python -m sglang.launch_server \\
        --model-path "/models/Qwen3.5 122B" \\
        --tp 4 \\
    # interleaved comment, skipped by systemd
        --mem-fraction-static=0.85 \\
        --attention-backend triton \\
        --cuda-graph-bs 1 2 4 8 \\
        --enable-mixed-chunk \\
        --served-model-name 'qwen\\x2dprod' \\
        --port 30000
    Restart=always

    [Install]
    WantedBy=multi-user.target
    """
)

SCRIPT = textwrap.dedent(
    """\
    #!/bin/bash
    # launch sglang
    set -euo pipefail
    export HF_HOME=/data/hf
    CUDA_VISIBLE_DEVICES=0,1 exec python -m sglang.launch_server --model-path "/models/q w" \\
        --tp 2 --mem-fraction-static 0.8 \\
        --enable-torch-compile 2>&1 | tee /var/log/sglang.log
    """
)


def test_systemd_unit_is_parsed_faithfully() -> None:
    unit = UnitFile.parse(UNIT)
    assert unit.kind == "systemd"
    cmd = unit.command
    assert cmd.prefix == "-"
    assert cmd.executable == "/opt/venv/bin/python"
    assert cmd.args[:4] == ("-m", "sglang.launch_server", "--model-path", "/models/Qwen3.5 122B")
    assert cmd.flags == {
        "--model-path": "/models/Qwen3.5 122B",
        "--tp": "4",
        "--mem-fraction-static": "0.85",
        "--attention-backend": "triton",
        "--cuda-graph-bs": "1 2 4 8",
        "--enable-mixed-chunk": None,
        "--served-model-name": "qwen-prod",
        "--port": "30000",
    }
    assert unit.environment == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "HF_HOME": "/data/hf cache",
        "NCCL_DEBUG": "WARN",
    }
    assert unit.working_directory == "/opt/sglang"
    assert unit.render() == UNIT


def test_launch_script_is_parsed() -> None:
    unit = UnitFile.parse(SCRIPT)
    assert unit.kind == "script"
    assert unit.command.executable == "python"
    assert unit.command.env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert unit.command.flags == {
        "--model-path": "/models/q w",
        "--tp": "2",
        "--mem-fraction-static": "0.8",
        "--enable-torch-compile": None,
    }


def test_replacing_a_value_changes_only_its_bytes() -> None:
    new = UnitFile.parse(UNIT).set_flag("--tp", "8").render()
    assert new == UNIT.replace("    --tp 4 \\", "    --tp 8 \\")
    new = UnitFile.parse(UNIT).set_flag("--mem-fraction-static", "0.9").render()
    assert new == UNIT.replace("--mem-fraction-static=0.85", "--mem-fraction-static=0.9")


def test_adding_and_removing_flags_keeps_the_layout() -> None:
    unit = UnitFile.parse(UNIT)
    added = unit.set_flag("--enable-fused-moe-sum-all-reduce").render()
    assert added == UNIT.replace(
        "    --port 30000\n", "    --port 30000 \\\n    --enable-fused-moe-sum-all-reduce\n"
    )
    removed = unit.unset_flag("--attention-backend").render()
    assert removed == UNIT.replace("    --attention-backend triton \\\n", "")
    assert "# interleaved comment" in unit.unset_flag("--mem-fraction-static").render()
    last = unit.unset_flag("--port").render()
    assert "--served-model-name 'qwen\\x2dprod'\nRestart=always" in last
    script = UnitFile.parse(SCRIPT).set_flag("--tp", "4").unset_flag("--enable-torch-compile")
    assert script.render() == SCRIPT.replace("--tp 2", "--tp 4").replace(
        " \\\n    --enable-torch-compile", ""
    )


def test_boolean_to_value_and_values_starting_with_a_dash() -> None:
    unit = UnitFile.parse(UNIT)
    assert unit.set_flag("--enable-mixed-chunk", "1").command.flags["--enable-mixed-chunk"] == "1"
    neg = unit.set_flag("--tp", "-1")
    assert neg.command.flags["--tp"] == "-1"
    dashed = unit.set_flag("--served-model-name", "--port")
    assert dashed.command.flags["--served-model-name"] == "--port"
    assert dashed.command.flags["--port"] == "30000"
    assert unit.set_flag("--cuda-graph-bs", ["1", "2"]).command.flags["--cuda-graph-bs"] == "1 2"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[Service]\nType=simple\n", "no ExecStart"),
        ("ExecStart=/bin/x\n", "outside of any [Section]"),
        ("[Service\nExecStart=/bin/x\n", "malformed section"),
        ("[Service]\nExecStart=/bin/x --a 'open\n", "unterminated"),
        ("[Service]\nExecStart=/bin/x\nExecStart=/bin/y\n", "2 ExecStart"),
        ("[Service]\nExecStart=/bin/x ; /bin/rm -rf /\n", "second command"),
        ("[Service]\nExecStart=/bin/x\x00\n", "NUL"),
        ("[Service]\njust words\nExecStart=/bin/x\n", "expected Key=value"),
        ("[Service]\nEnvironment=NOEQUALS\nExecStart=/bin/x\n", "not NAME=value"),
        ("#!/bin/sh\necho nothing here\n", "no `launch_server`"),
    ],
)
def test_malformed_files_are_rejected(text: str, message: str) -> None:
    kind = "script" if text.startswith("#!") else "systemd"
    with pytest.raises(UnitFileError, match=re.escape(message)):
        UnitFile.parse(text, kind=kind)


@pytest.mark.parametrize("value", ["0.9\n[Service]", "a\rb", "x\x00y", "tab\there", "bell\x07"])
def test_values_that_could_start_a_new_line_are_rejected(value: str) -> None:
    with pytest.raises(UnitFileError):
        UnitFile.parse(UNIT).set_flag("--tp", value)
    with pytest.raises(UnitFileError):
        UnitFile.parse(SCRIPT).set_flag("--tp", value)


@pytest.mark.parametrize("flag", ["tp", "--", "--a b", "--x=1", "--$(id)", "---"])
def test_bad_flag_names_are_rejected(flag: str) -> None:
    with pytest.raises(UnitFileError, match="not a valid flag"):
        UnitFile.parse(UNIT).set_flag(flag, "1")


def test_unsetting_an_absent_flag_is_an_error() -> None:
    with pytest.raises(UnitFileError, match="not set"):
        UnitFile.parse(UNIT).unset_flag("--nope")


def test_diff_names_the_change() -> None:
    new = UnitFile.parse(UNIT).set_flag("--tp", "8").render()
    diff = unified_diff(UNIT, new, name="sglang.service")
    assert "-    --tp 4 \\\n+    --tp 8 \\\n" in diff
    assert diff.startswith("--- a/sglang.service\n+++ b/sglang.service\n")


# --- properties ---------------------------------------------------------------------------------

values = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF, exclude_characters="\x7f"), max_size=30)
flag_names = st.from_regex(r"--[a-z][a-z0-9-]{0,15}", fullmatch=True)
fillers = st.sampled_from(["", "# c\n", "; c\n", "\n", "X-Note=a \\\n  b\n"])


@st.composite
def units(draw: st.DrawFn) -> str:
    words = draw(
        st.lists(st.sampled_from(["--a 1", "--b", "--c=x", "--d 'q r'", '--e "s t"', "-x"]), max_size=5)
    )
    sep = draw(st.sampled_from([" ", " \\\n    ", "  \\\n\t"]))
    head = draw(st.sampled_from(["", "# c\n", "\n[Unit]\nA=b \\\n c\n"])) + "[Service]\n" + draw(fillers)
    return head + "ExecStart=/usr/bin/srv run" + "".join(sep + w for w in words) + "\n" + draw(fillers)


@settings(max_examples=150, deadline=None)
@given(units(), flag_names, values)
@example(
    text="[Service]\nExecStart=/usr/bin/srv run --a 1 --a 1\n; c\n",
    flag="--a",
    value="",
)
@example(
    text="[Service]\nExecStart=/usr/bin/srv run --a 1 --a 1\n",
    flag="--a",
    value="00",
)
@example(
    text="[Service]\nExecStart=/usr/bin/srv run --a 1 --a 1\n",
    flag="--a",
    value="*",
)
def test_edits_round_trip_and_values_stay_in_their_argument(text: str, flag: str, value: str) -> None:
    unit = UnitFile.parse(text)
    assert unit.render() == text
    new = unit.set_flag(flag, value)
    reparsed = UnitFile.parse(new.render())
    assert reparsed.command.flags[flag] == value
    argv = reparsed.exec_argv()
    hits = [i for i, a in enumerate(argv) if a in (flag, f"{flag}={value}")]
    assert len(hits) == 1
    assert argv[hits[0]] == f"{flag}={value}" or argv[hits[0] + 1] == value
    others = {k: v for k, v in unit.command.flags.items() if k != flag}
    assert {k: v for k, v in reparsed.command.flags.items() if k != flag} == others
    if flag not in unit.command.flags:
        assert new.unset_flag(flag).render() == text  # add then remove: every byte as before


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_script_values_reach_the_process_as_one_argument(value: str) -> None:
    script = f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c 'import sys; print(repr(sys.argv[1:]))' launch_server --a 1\n"
    unit = UnitFile.parse(script, kind="script").set_flag("--v", value)
    out = subprocess.run(["sh", "-c", unit.render()], capture_output=True, text=True, check=True).stdout
    argv = eval(out)  # the repr of a list of str printed by the child
    assert argv[:3] == ["launch_server", "--a", "1"]
    assert argv[3:] in (["--v", value], [f"--v={value}"])


def test_a_wrapped_server_s_flags_start_after_its_entry_point() -> None:
    docker = (
        "[Service]\nExecStart=/usr/bin/docker run --rm --gpus all -p 30000:30000 --shm-size 32g "
        "lmsysorg/sglang:v0.5.23 python3 -m sglang.launch_server --model-path /m --tp 2\n"
    )
    unit = UnitFile.parse(docker)
    assert unit.command.flags == {"--model-path": "/m", "--tp": "2"}  # not docker's --gpus, -p, --shm-size
    edited = unit.set_flag("--enable-mixed-chunk").set_flag("--tp", "4")
    assert edited.command.flags == {"--model-path": "/m", "--tp": "4", "--enable-mixed-chunk": None}
    assert "--rm --gpus all -p 30000:30000 --shm-size 32g lmsysorg" in edited.render()  # docker's untouched
    serve = UnitFile.parse("[Service]\nExecStart=/opt/venv/bin/sglang serve --model-path /m --tp 4\n")
    assert serve.command.flags == {"--model-path": "/m", "--tp": "4"}


@pytest.mark.parametrize(
    "shell", ["/bin/bash -c", "/bin/sh -ec", "bash -lc", "/bin/bash --login -o pipefail -c"]
)
def test_a_server_started_inside_a_shell_string_is_refused_with_what_to_write(shell: str) -> None:
    text = f'[Service]\nExecStart={shell} "source /opt/venv/bin/activate && python -m sglang.launch_server --tp 2"\n'
    with pytest.raises(
        UnitFileError, match=r"runs a shell string .*exec python -m sglang.launch_server \"\$@\""
    ):
        UnitFile.parse(text)
    # a shell running a script file, which gets the flags as its own arguments, is fine (a `-c` after
    # the script is the script's)
    for script in ("/bin/bash /opt/start-sglang.sh --tp 2", "/bin/bash -l /opt/start-sglang.sh -c x --tp 2"):
        assert UnitFile.parse(f"[Service]\nExecStart={script}\n").command.flags["--tp"] == "2"
