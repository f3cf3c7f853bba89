"""Certainty from outcomes (issue 53 item 1): each rule's record on the taught labels, per basis,
shrunk toward a Beta(3, 1) prior; an unsettled verdict stays at or below 0.6; the committed counts
are the sum of the committed cases, which are exactly the taught labels (each case's rule, basis
and outcome is checked against research in tests/test_research_labels.py); a sealed label file is
never read as taught nor printed case by case by benchmarks/bench_research.py."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

from tests.fixtures.sglang_src import synthetic_tree
from tests.research_profiles import DATA, SealedError, case_id, is_sealed, load_cases, taught_files
from tools.research.analysis import analyze_flag
from tools.research.index import load_index
from tools.research.verdict import calibration
from tools.research.verdict.calibration import CAP, UNKNOWN, certainty, counts, recorded_cases, tally, write
from tools.research.verdict.decide import BASES, RULES

ROOT = Path(__file__).resolve().parent.parent


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_research", ROOT / "benchmarks" / "bench_research.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_research"] = module
    spec.loader.exec_module(module)
    return module


def _outcomes(rule: str, basis: str, right: int, wrong: int) -> list[tuple[str, str, str, bool]]:
    return [(f"{rule} {i}", rule, basis, i < right) for i in range(right + wrong)]


def test_a_certainty_is_the_rules_record_on_its_basis_shrunk_toward_the_prior(tmp_path: Path) -> None:
    path = tmp_path / "calibration.toml"
    outcomes = [
        *_outcomes("a", "guard", 6, 0),
        *_outcomes("a", "reached", 12, 12),
        *_outcomes("b", "startup", 40, 0),
        *_outcomes("c", "open", 40, 0),
    ]
    write(["x.toml"], outcomes, path)
    assert certainty("a", "guard", path=path) == 0.9  # (6 + 3) / (6 + 4)
    assert certainty("a", "reached", path=path) == 0.54  # the same rule on another basis: its own record
    assert certainty("b", "startup", path=path) == 0.98  # (40 + 3) / 44
    assert certainty("never-seen", "guard", path=path) == 0.75  # the prior alone
    # resting on something unsettled: at most CAP, whatever the record; unknown claims nothing
    assert certainty("c", "open", unsettled="a guard left open: x", path=path) == CAP
    assert certainty("a", "reached", unsettled="a fact missing: y", path=path) == 0.54
    assert certainty("b", "startup", verdict="unknown", path=path) == UNKNOWN
    calibration._load.cache_clear()


def test_the_committed_counts_are_the_sum_of_its_cases_and_its_cases_the_taught_labels() -> None:
    data = tomllib.loads(calibration.COUNTS.read_text())
    assert data["files"] == taught_files()
    cases = recorded_cases()
    assert set(cases) == {case_id(n, c) for n in taught_files() for c in load_cases(n)}
    per_key, _ = tally(
        (case_id_, *record.split()[0].split("/"), record.split()[1] == "right")
        for case_id_, record in cases.items()
    )
    assert per_key == counts()
    names = {r.name for r in RULES} | {"not-a-flag"}
    for key in counts():
        rule, basis = key.split("/")
        assert rule in names and basis in BASES, key


def test_the_rules_have_distinct_names() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names)) and "not-a-flag" not in names


def test_a_sealed_label_file_is_never_taught_nor_loaded_as_taught() -> None:
    """Only the top-level key of the sealed file is read here, never its cases."""
    sealed = [p.name for p in DATA.glob("research_labels*.toml") if is_sealed(p.name)]
    assert sealed, "the issue 53 sealed set is committed"
    for name in sealed:
        assert name not in taught_files() and name not in calibration.label_files()
        with pytest.raises(SealedError):
            load_cases(name)


def _rows(bench, sealed: bool):  # type: ignore[no-untyped-def]
    case = {
        "version": "9.9.9",
        "profile": "secret-profile",
        "flag": "--secret-flag",
        "verdict": "no-op",
        "kind": "k",
    }
    rows = [
        bench.Row(case, "applies", 0.93, False, "reader-runs", "guard", ""),
        bench.Row(case, "no-op", 0.96, True, "every-reader-off", "guard", ""),
        bench.Row(case, "applies", 0.5, False, "reader-runs", "open", "a guard left open: x"),
        bench.Row(case, "dead", 0.92, True, "no-reader", "index", ""),
    ]
    return bench.Scored("research_labels_x.toml", sealed, rows)


def test_a_sealed_score_prints_totals_and_bands_only(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    sealed = _rows(bench, True)
    with pytest.raises(SealedError):
        bench.print_scores(sealed)  # the per-case, per-kind, per-version printing refuses it
    with pytest.raises(SealedError):
        bench.taught_outcomes([sealed])  # nor is it counted for certainties
    capsys.readouterr()
    bench.print_sealed(sealed)
    out = capsys.readouterr().out
    for secret in ("9.9.9", "secret-profile", "--secret-flag", "reader-runs", "guard", "applies", " k "):
        assert secret not in out, (secret, out)
    assert "2/4 verdicts right (50%)" in out
    assert "at certainty >= 0.9: 2/3 right (67%)" in out
    assert "certainty of each wrong verdict: [0.5, 0.93]" in out
    table = out[out.index("certainty ") :]
    assert "0.95 to 1.00          1      1   100%            0.96" in table
    assert "0.90 to 0.95          2      1    50%            0.93" in table
    assert "0.60 or less          1      0     0%            0.50" in table
    # a taught file prints case by case
    bench.print_scores(_rows(bench, False))
    assert "--secret-flag" in capsys.readouterr().out


FILES = {
    "srt/server_args.py": """
        from dataclasses import dataclass

        @dataclass
        class ServerArgs:
            open_flag: bool = False
            sure_flag: bool = False

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--open-flag", action="store_true")
                parser.add_argument("--sure-flag", action="store_true")
        """,
    "srt/layers/runner.py": """
        from sglang.srt.server_args import get_global_server_args

        def step(batch):
            if batch.is_decode and get_global_server_args().open_flag:
                return fast(batch)
            return slow(batch)

        def build(model_config):
            if model_config.num_experts > 0 and get_global_server_args().sure_flag:
                return fused()
            return plain()
        """,
}


def test_a_verdict_names_its_rule_basis_and_what_is_unsettled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader whose condition is runtime state (`batch.is_decode`) applies on an open guard: the
    verdict says what is open and claims at most 0.6; one whose conditions are all decided from
    the model's facts rests on them, with its rule's record."""
    tree = synthetic_tree(tmp_path, monkeypatch, FILES, "0.0.1")
    index = load_index(tree)
    facts = {"model.num_experts": 8, "gpu.sm": 90, "gpu.count": 1}
    open_ = analyze_flag(index, "--open-flag", facts)
    assert (open_.verdict, open_.rule, open_.basis) == ("applies", "reader-runs", "open"), open_.summary
    assert "runtime state" in open_.unsettled and open_.certainty <= 0.6
    sure = analyze_flag(index, "--sure-flag", facts)
    assert (sure.verdict, sure.rule) == ("applies", "reader-runs"), sure.summary
    assert sure.basis in ("guard", "reached") and not sure.unsettled
    assert sure.certainty == certainty("reader-runs", sure.basis)
    dense = analyze_flag(index, "--sure-flag", {**facts, "model.num_experts": 0})
    assert (dense.verdict, dense.rule, dense.basis) == ("no-op", "every-reader-off", "guard"), dense.summary
    assert dense.certainty == certainty("every-reader-off", "guard")
    missing = analyze_flag(index, "--not-a-flag-here", facts)
    assert (missing.verdict, missing.rule, missing.basis) == (
        "incompatible-with-version",
        "not-a-flag",
        "catalog",
    )
