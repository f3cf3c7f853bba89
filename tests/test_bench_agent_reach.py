"""`benchmarks/bench_agent.py`'s yardstick beside the rule oracle (issue 29): each member of the rule
oracle weighed by the chance one trial keeps a change of its margin, so a run can be read against
what the rule's own statistics allow; and a scenario file nobody shipped runs like a shipped one."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "bench_agent", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_agent.py"
)
ba = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
spec.loader.exec_module(ba)  # type: ignore[union-attr]

BASE = {1: 100.0, 8: 400.0, 64: 1000.0}


def table(values: dict[tuple[frozenset, str], dict[int, float]]):  # type: ignore[no-untyped-def]
    """A noise-free model given as a table: (set, workload) -> tok/s per level."""
    return lambda changes, workload="random": values[(frozenset(changes), workload)]


def test_a_members_margin_is_what_it_adds_over_the_set_without_it_at_its_best_level_on_its_workload():
    a, b = "--enable-torch-compile", "--enable-mixed-chunk"
    levels = table({
        (frozenset({a, b}), "random"): {1: 110.0, 8: 420.0, 64: 1020.0},
        (frozenset({a}), "random"): {1: 110.0, 8: 420.0, 64: 1000.0},
        (frozenset({b}), "random"): {1: 100.0, 8: 400.0, 64: 1020.0},
        # b acts on scheduling: its trial runs on the mix, where it adds 3% at c=64
        (frozenset({a, b}), "mix"): {1: 90.0, 8: 300.0, 64: 824.0},
        (frozenset({a}), "mix"): {1: 90.0, 8: 300.0, 64: 800.0},
    })  # fmt: skip
    got = {m["change"]: m for m in ba.margins([a, b], levels, {b}, BASE)}
    assert got[a]["level"] == 1 and got[a]["margin"] == pytest.approx(0.10)
    assert got[b]["level"] == 64 and got[b]["margin"] == pytest.approx(0.03)
    # shares are on the random prompts: a's c=1 +10% and c=8 +5% against b's c=64 +2%
    assert got[a]["share"] == pytest.approx((math.log(1.1) + math.log(1.05)) / 3)
    assert got[b]["share"] == pytest.approx(math.log(1.02) / 3)


def test_the_reach_weighs_each_member_by_the_chance_the_rule_keeps_its_margin():
    chance = dict(ba.KEEP_CHANCE)
    big = {"change": "x", "level": 64, "margin": 0.12, "share": math.log(1.08)}
    edge = {"change": "y", "level": 8, "margin": 0.02, "share": math.log(1.02)}
    assert ba.keep_chance(0.019) == 0.0 and ba.keep_chance(0.02) == chance[0.02]
    assert ba.keep_chance(0.2) == max(chance.values())  # no better than the best measured
    assert chance[0.02] < ba.keep_chance(0.022) < chance[0.025]  # interpolated
    assert ba.reach(0.02, [edge]) == pytest.approx(math.expm1(math.log(1.02) * chance[0.02]))
    both = ba.reach(1.08 * 1.02 - 1, [big, edge])
    alone = math.expm1(math.log(1.08) * ba.keep_chance(0.12) + math.log(1.02) * chance[0.02])
    assert both == pytest.approx(alone)
    assert ba.reach(1.08 * 1.02 - 1, [big, edge]) < 1.08 * 1.02 - 1
    assert ba.reach(0.0, []) == 0.0
    # the shares weigh; the set's own gain is what they are a share of (interactions included)
    assert ba.reach(0.05, [big, edge]) == pytest.approx(math.expm1(math.log(1.05) * both_weight(big, edge)))
    # a member that costs on the random prompts (it earns its place on the mix) has no share
    costly = {"change": "z", "level": 64, "margin": 0.03, "share": -0.01}
    assert ba.reach(0.02, [edge, costly]) == pytest.approx(ba.reach(0.02, [edge]))
    # none with a share: the plain mean of the chances
    flat = [{**edge, "share": 0.0}, {**costly, "share": 0.0}]
    assert ba.reach(0.02, flat) == pytest.approx(
        math.expm1(math.log(1.02) * (chance[0.02] + chance[0.03]) / 2)
    )
    # read monotone: Monte Carlo noise in the table does not make a larger gain less keepable
    assert ba.keep_chance(0.12) >= ba.keep_chance(0.08) >= ba.keep_chance(0.06)


def both_weight(*members: dict) -> float:
    return sum(m["share"] * ba.keep_chance(m["margin"]) for m in members) / sum(m["share"] for m in members)


def test_a_scenario_file_outside_the_shipped_ones_is_benchmarked_with_its_own_model(tmp_path):
    # a held-out deployment: its file elsewhere, its model config beside it (relative path); the
    # fast copy the run launches lives in another folder and must still find that model
    from sim.scenario import SCENARIO_DIR, load_scenario

    (tmp_path / "models" / "tiny").mkdir(parents=True)
    model = tmp_path / "models" / "tiny" / "config.json"
    model.write_text((SCENARIO_DIR.parent / "models" / "Llama-3.1-8B" / "config.json").read_text())
    text = (
        (SCENARIO_DIR / "l40s-llama8b.toml")
        .read_text()
        .replace('config = "Llama-3.1-8B"', 'config = "models/tiny"')
    )
    held_out = tmp_path / "held-out.toml"
    held_out.write_text(text.replace('name = "l40s-llama8b"', 'name = "held-out"'))
    out = tmp_path / "run"
    out.mkdir()
    copy = ba.fast_scenario(str(held_out), out, changes=["--enable-mixed-chunk"])
    scn = load_scenario(copy)
    assert copy.parent == out and scn.name == "held-out" and scn.model_dir == model.parent.resolve()
    assert "--enable-mixed-chunk" in scn.launch.flags and scn.timing.startup_s == 5
    assert ba.noise_free(str(held_out), [])[64] == pytest.approx(ba.noise_free("l40s-llama8b", [])[64])
