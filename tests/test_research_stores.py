"""A reader whose value is only stored in a module global (tools.research.follow.stores), on a small SGLang-shaped
tree: the store is followed one step to the module's reads of that global; a store read back only
to steer more assignments is unknown, one read back and used runs, one whose reads are all gated
off is off, and an attribute store (`self.x = ...`) stays a running reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.policy.builtin.research import decide_verdict
from tests.fixtures.sglang_src import synthetic_tree
from tools.research.analysis import analyze_flag
from tools.research.index import load_index

FILES = {
    "srt/server_args.py": """
        from dataclasses import dataclass

        @dataclass
        class ServerArgs:
            switch_flag: str = None
            mode_flag: bool = False
            gated_flag: bool = False
            splits_flag: int = 8
            runner_flag: str = "auto"
            draft_runner: str = None
            tp_size: int = 1
            pp_size: int = 1
            dp_size: int = 1

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--switch-flag", default=ServerArgs.switch_flag)
                parser.add_argument("--mode-flag", action="store_true")
                parser.add_argument("--gated-flag", action="store_true")
                parser.add_argument("--splits-flag", type=int, default=ServerArgs.splits_flag)
                parser.add_argument("--runner-flag", default=ServerArgs.runner_flag)
                parser.add_argument("--draft-runner", default=ServerArgs.draft_runner)
                parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size)
                parser.add_argument("--pp-size", type=int, default=ServerArgs.pp_size)
                parser.add_argument("--dp-size", type=int, default=ServerArgs.dp_size)
        """,
    "srt/state.py": """
        _SWITCH = False
        _MODE = False
        _GATED = False
        _GROUP = None

        def set_switch(enable: bool):
            global _SWITCH
            _SWITCH = enable

        def set_mode(enable: bool):
            global _MODE
            _MODE = enable

        def set_gated(enable: bool):
            global _GATED
            _GATED = enable

        def tag_groups():
            if not _SWITCH:
                return
            group = _GROUP
            group.hint = "attn"

        def make_group():
            use_mode = _MODE
            return Group(use_mode)

        def use_gated():
            if _GATED:
                allocate()

        def setup():
            world_size, rank = get_group()
            if world_size <= 1:
                return
            use_gated()
        """,
    "srt/moe_state.py": """
        RUNNER = None
        DRAFT_RUNNER = None

        def init_moe(server_args):
            global RUNNER
            global DRAFT_RUNNER
            RUNNER = Backend(server_args.runner_flag)
            DRAFT_RUNNER = Backend(server_args.draft_runner) if server_args.draft_runner is not None else RUNNER

        def get_runner():
            global RUNNER
            if RUNNER is None:
                RUNNER = Backend("auto")
            return RUNNER

        class Method:
            def __init__(self):
                self.use_cutlass = get_runner().is_cutlass()
        """,
    "srt/bootstrap.py": """
        from sglang.srt.config import get_args
        from sglang.srt.state import set_gated, set_mode, set_switch

        def set_flags():
            set_switch(get_args().switch_flag is not None)
            set_mode(get_args().mode_flag)
            set_gated(get_args().gated_flag)

        class Attention:
            def __init__(self):
                self.splits = get_args().splits_flag
        """,
}


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return load_index(synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.7"))


def _facts(tp: int) -> dict[str, object]:
    return {"gpu.sm": 90, "gpu.count": tp, "server.tp_size": tp}


def test_a_value_stored_and_read_back_only_to_store_again_is_unknown(index) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(index, "--switch-flag", _facts(1), value="auto")
    assert v.verdict == "unknown", v.summary
    (reader,) = v.findings
    assert reader.location == "sglang/srt/bootstrap.py:6" and reader.state == "unknown"
    assert reader.why == (
        "stores the value at sglang/srt/state.py:9 (_SWITCH in set_switch)"
        " (not followed: read back only to store it again)"
    )
    # the playbook's rule decides then, labelled as the playbook's
    need = {"condition": "server.tp_size > 1", "actual": 1, "outcome": "fail"}
    usage = {"code_verdict": v.verdict, "code_summary": v.summary}
    got = decide_verdict("--switch-flag", {"playbook": {"needs": [need]}}, usage)
    assert (got["verdict"], got["decided_by"]) == ("no-op", "playbook")


def test_an_applies_the_code_could_not_settle_leaves_a_fact_based_rule_standing() -> None:
    """ "applies" at certainty 0.55 (a reader whose conditions are open at run time) against the
    playbook's "needs server.tp_size > 1" on one GPU: the rule, decided on a fact, stands; a sure
    "applies" (0.9) still overrules it."""
    need = {"condition": "server.tp_size > 1", "actual": 1, "outcome": "fail"}
    lookup = {"playbook": {"needs": [need]}}
    open_ = {"code_verdict": "applies", "code_summary": "read at x.py:1", "certainty": 0.55}
    got = decide_verdict("--fusion", lookup, open_)
    assert (got["verdict"], got["decided_by"]) == ("no-op", "playbook")
    assert "could not settle" in got["summary"]
    sure = {**open_, "certainty": 0.9}
    got = decide_verdict("--fusion", lookup, sure)
    assert (got["verdict"], got["decided_by"]) == ("applies", "code")


def test_a_stored_value_read_back_and_used_applies(index) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(index, "--mode-flag", _facts(1))
    assert v.verdict == "applies", v.summary
    (reader,) = v.findings
    assert "read back at sglang/srt/state.py:26 (assigned to use_mode)" in reader.why


def test_a_stored_value_whose_every_read_is_gated_off_is_a_no_op(index) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(index, "--gated-flag", _facts(1))
    assert v.verdict == "no-op", v.summary
    (reader,) = v.findings
    assert reader.state == "off" and "every read of _GATED is off here" in reader.why
    assert "gated at sglang/srt/state.py:35" in reader.why and "world_size <= 1" in reader.why
    assert analyze_flag(index, "--gated-flag", _facts(4)).verdict == "applies"


def test_an_attribute_store_stays_a_running_reader(index) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(index, "--splits-flag", _facts(1), value="16")
    assert v.verdict == "applies", v.summary


def test_a_value_stored_in_a_declared_global_is_stored_there_whatever_reads_it_next(index) -> None:  # type: ignore[no-untyped-def]
    """`global RUNNER; RUNNER = Backend(args.runner_flag)`, then `DRAFT_RUNNER = ... else RUNNER`
    (0.5.9's `initialize_moe_config`): the value lives in RUNNER, which a getter hands out to code
    that runs; it is not the draft's global, never read, that decides (which made 0.5.9's
    `--moe-runner-backend flashinfer_cutlass` on Mixtral a no-op)."""
    v = analyze_flag(index, "--runner-flag", _facts(1), value="cutlass")
    reader = next(f for f in v.findings if f.location == "sglang/srt/moe_state.py:8")
    assert "(RUNNER)" in reader.why and "DRAFT_RUNNER" not in reader.why, reader.why
    assert reader.state != "off" and v.verdict == "applies", v.summary
