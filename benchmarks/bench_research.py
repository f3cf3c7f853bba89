"""Research speed on the full SGLang trees: index build (cold), then one flag's verdict with a warm index.

Usage: python benchmarks/bench_research.py [--source DIR ...] [--rebuild]
       python benchmarks/bench_research.py --labels [--no-startup]
       python benchmarks/bench_research.py --calibrate
       python benchmarks/bench_research.py --sealed research_labels_sealed-<date>.toml
Without --source it uses the cached 0.5.23 and 0.5.9 trees (fetching them once from the index).

`--labels` scores research against the hand-read truths of every taught label file
(tests/data/research_labels*.toml but the sealed ones): per file the share right per kind and per
version and the wrong verdicts, then for all of them together a calibration table (per certainty
band: verdicts, right, share, mean certainty) and the record of each rule on each basis.
`--calibrate` rewrites tools/research/verdict/calibration.toml from the same outcomes: the counts each
verdict's certainty is computed from (`tools.research.verdict.calibration`); run it whenever labels or
research change (tests/test_research_labels.py fails until it is run).

`--sealed FILE` scores a sealed file (top-level `sealed = true`) once, at the end of the work it
measures: only the totals (right / cases, right at certainty >= 0.9, the certainty of each wrong
verdict) and the calibration table are printed, never a case, a kind or a version; the per-case
printing refuses a sealed file (`print_scores`), and no sealed file is ever calibrated on.

Three numbers per tree and flag, with the story's facts (SM120, 4 GPUs, TP 4, Qwen3.5-122B-A10B):
- `fresh process`: `python -c` that opens the on-disk index and researches the flag (what one
  `optagent research` call pays for research, without the CLI's own imports);
- `in-process, first`: the first call in a process that already opened the index;
- `in-process, again`: a repeat (what the agent pays for its second and later flags).
Targets (issue 10): one flag < 0.3 s, `--tp-size` < 1 s with a warm index. Each figure is also
stated as a ratio to `rg` over the same tree in the same run (issue 25 item 6), so a loaded
machine shows as such.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from tools.research.analysis import analyze_flag
from tools.research.index import load_index
from tools.research.source import get_source, local_source
from tools.research.verdict.calibration import CAP, COUNTS, UNKNOWN, certainty, share, tally, write

FLAGS = [
    "--enable-fused-moe-sum-all-reduce",
    "--enable-flashinfer-allreduce-fusion",
    "--triton-attention-reduce-in-fp32",
    "--num-continuous-decode-steps",
    "--attention-backend",
    "--mem-fraction-static",
    "--cuda-graph-max-bs",
    "--moe-runner-backend",
    "--enable-torch-compile",
    "--tp-size",
]
FACTS = {
    "gpu.sm": 120,
    "gpu.count": 4,
    "server.tp_size": 4,
    "server.attention_backend": "triton",
    "model.architecture": "Qwen3_5MoeForConditionalGeneration",
    "model.experts_per_tok": 8,
    "model.num_experts": 256,
    "model.quantization": None,
}
_CHILD = """
import sys, time
t0 = time.perf_counter()
from tools.research.analysis import analyze_flag
from tools.research.index import load_index
from tools.research.source import local_source
from pathlib import Path
tree = local_source(Path(sys.argv[1]))
v = analyze_flag(load_index(tree), sys.argv[2], eval(sys.argv[3]))
print(f"{time.perf_counter() - t0:.4f} {v.verdict}")
"""


def rg_seconds(tree_root: Path, pattern: str) -> float | None:
    """Seconds `rg -c PATTERN TREE` takes (the baseline the issue asks speed to be stated against:
    a plain text search of the same tree, on the same machine, in the same run); None without rg."""
    rg = shutil.which("rg")
    if rg is None:
        return None
    t0 = time.perf_counter()
    subprocess.run([rg, "-c", "--no-messages", pattern, str(tree_root)], capture_output=True, check=False)
    return time.perf_counter() - t0


def fresh(tree_root: Path, flag: str) -> tuple[float, str]:
    """Seconds a fresh interpreter needs to import, open the index and research `flag`."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tree_root), flag, repr(FACTS)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    seconds, verdict = out.stdout.split()
    return float(seconds), verdict


class Row(NamedTuple):
    """One case scored: the truth, research's verdict, its certainty and what decided it."""

    case: dict
    verdict: str
    certainty: float
    right: bool
    rule: str
    basis: str
    unsettled: str


@dataclass
class Scored:
    """One label file scored, case by case."""

    name: str
    sealed: bool
    rows: list[Row] = field(default_factory=list)


def score_labels(name: str, *, use_startup: bool = True, sealed_ok: bool = False) -> Scored:
    """Every case of one label file, researched on its deployment; a sealed file only with
    `sealed_ok` (its one scoring, `--sealed`)."""
    from tests.research_profiles import case_startup, is_sealed, load_cases, profile_facts

    out = Scored(name, is_sealed(name))
    for case in load_cases(name, sealed_ok=sealed_ok):
        tree = get_source(case["version"])
        startup = case_startup(tree, case) if use_startup else None
        v = analyze_flag(
            load_index(tree),
            case["flag"],
            profile_facts(case["profile"]),
            value=case.get("value"),
            startup=startup,
        )
        right = v.verdict == case["verdict"]
        out.rows.append(Row(case, v.verdict, v.certainty, right, v.rule, v.basis, v.unsettled))
    return out


def recertified(scored: Scored) -> Scored:
    """The same outcomes with the certainties the calibration file now gives."""
    rows = [
        r._replace(certainty=certainty(r.rule, r.basis, unsettled=r.unsettled, verdict=r.verdict))
        for r in scored.rows
    ]
    return Scored(scored.name, scored.sealed, rows)


def print_scores(scored: Scored) -> None:
    """Share right per kind and per version, and the wrong verdicts: never for a sealed file."""
    from tests.research_profiles import SealedError

    if scored.sealed:
        raise SealedError(f"{scored.name} is sealed: only print_sealed may show it")
    rows = scored.rows
    right = sum(r.right for r in rows)
    print(f"\n{scored.name}: {right}/{len(rows)} right ({100 * right / max(1, len(rows)):.0f}%)")
    for key in ("kind", "version"):
        groups: dict[str, list[bool]] = {}
        for r in rows:
            groups.setdefault(r.case.get(key) or f"taught: {r.case['verdict']}", []).append(r.right)
        print(f"  {'by ' + key:28} right / cases")
        for k, rs in sorted(groups.items()):
            print(f"  {k:28} {sum(rs):5} / {len(rs)}")
    wrong = [r for r in rows if not r.right]
    if wrong:
        print("  wrong:")
    for r in wrong:
        c = r.case
        print(
            f"    {c['version']} {c['profile']} {c['flag']} {c.get('value', '')}: {r.verdict} "
            f"({r.certainty:.2f}, {r.rule}/{r.basis}), truth {c['verdict']}"
        )


BANDS = (
    ("0.95 to 1.00", 0.95, 2.0),
    ("0.90 to 0.95", 0.9, 0.95),
    ("0.80 to 0.90", 0.8, 0.9),
    ("0.61 to 0.80", 0.605, 0.8),
    ("0.60 or less", 0.0, 0.605),
)
"""Certainty bands, low end included; 0.60 or less is a verdict resting on something unsettled."""


def calibration_table(certainties: list[tuple[float, bool]]) -> list[str]:
    """Per certainty band: verdicts, right, share right, mean certainty."""
    lines = [f"  {'certainty':14} {'verdicts':>8} {'right':>6} {'share':>6} {'mean certainty':>15}"]
    for label, low, high in BANDS:
        band = [(c, r) for c, r in certainties if low <= round(c, 2) < high]
        if not band:
            lines.append(f"  {label:14} {0:8} {0:6} {'-':>6} {'-':>15}")
            continue
        right = sum(r for _, r in band)
        mean = sum(c for c, _ in band) / len(band)
        lines.append(f"  {label:14} {len(band):8} {right:6} {100 * right / len(band):5.0f}% {mean:15.2f}")
    return lines


def print_sealed(scored: Scored) -> None:
    """A sealed file's one score: totals and the calibration table, nothing per case, kind or version."""
    rows = scored.rows
    right = sum(r.right for r in rows)
    sure = [r.right for r in rows if r.certainty >= 0.9]
    wrong = sorted(round(r.certainty, 2) for r in rows if not r.right)
    print(
        f"\n{scored.name} (sealed): {right}/{len(rows)} verdicts right ({100 * right / max(1, len(rows)):.0f}%)"
    )
    share_sure = f" ({100 * sum(sure) / len(sure):.0f}%)" if sure else ""
    print(f"  at certainty >= 0.9: {sum(sure)}/{len(sure)} right{share_sure}")
    print(f"  certainty of each wrong verdict: {wrong}")
    print("\n".join(calibration_table([(r.certainty, r.right) for r in rows])))


def taught_outcomes(scored: list[Scored]) -> list[tuple[str, str, str, bool]]:
    """(case id, rule, basis, right) of every taught case: what the calibration file counts."""
    from tests.research_profiles import SealedError, case_id

    out = []
    for s in scored:
        if s.sealed:
            raise SealedError(f"{s.name} is sealed: nothing is calibrated on it")
        out += [(case_id(s.name, r.case), r.rule, r.basis, r.right) for r in s.rows]
    return out


def left_out(rows: list[Row]) -> list[tuple[float, bool]]:
    """(certainty, right) of each taught case with its certainty counted without it: the
    calibration the counts would show on a case they had not seen (leave-one-out)."""
    per_key, _ = tally((str(i), r.rule, r.basis, r.right) for i, r in enumerate(rows))
    out = []
    for r in rows:
        n, right = per_key[f"{r.rule}/{r.basis}"]
        c = share(n - 1, right - r.right)
        c = UNKNOWN if r.verdict == "unknown" else min(c, CAP) if r.unsettled else c
        out.append((round(c, 2), r.right))
    return out


def print_rules(outcomes: list[tuple[str, str, str, bool]]) -> None:
    """Each rule's record on each basis, and the certainty it gives (`tools.research.verdict.calibration`)."""
    per_key, _ = tally(outcomes)
    print(f"\n  {'rule/basis':34} {'cases':>5} {'right':>5} {'certainty':>9}")
    for k, (n, r) in per_key.items():
        print(f"  {k:34} {n:5} {r:5} {share(n, r):9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, action="append", help="SGLang tree(s) instead of the cache.")
    parser.add_argument("--rebuild", action="store_true", help="Time a cold index build first.")
    parser.add_argument("--labels", action="store_true", help="Score against the hand-read labels.")
    parser.add_argument("--no-startup", action="store_true", help="Code index only (no SGLang start-up run).")
    parser.add_argument(
        "--calibrate", action="store_true", help="Rewrite tools/research/verdict/calibration.toml."
    )
    parser.add_argument("--sealed", metavar="FILE", help="Score a sealed label file once: totals only.")
    args = parser.parse_args()
    if args.sealed:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        print_sealed(score_labels(args.sealed, use_startup=not args.no_startup, sealed_ok=True))
        return
    if args.labels or args.calibrate:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.research_profiles import taught_files

        files = taught_files()
        scored = [score_labels(name, use_startup=not args.no_startup) for name in files]
        outcomes = taught_outcomes(scored)
        if args.calibrate:
            if args.no_startup:
                parser.error("--calibrate counts research as it runs: with SGLang's start-up")
            write(files, outcomes)
            scored = [recertified(s) for s in scored]
            print(f"wrote {COUNTS} from {len(outcomes)} taught cases ({', '.join(files)})")
        if args.labels:
            for s in scored:
                print_scores(s)
        every = [r for s in scored for r in s.rows]
        print(f"\ntaught set ({len(every)} cases): {sum(r.right for r in every)} right")
        for title, rows in (
            (
                "certainties as calibrated (counted on these very cases)",
                [(r.certainty, r.right) for r in every],
            ),
            ("each case's certainty counted without it (leave-one-out)", left_out(every)),
        ):
            sure = [r for c, r in rows if c >= 0.9]
            wrong = sorted(c for c, r in rows if not r)
            print(f"\n  {title}: at >= 0.9 {sum(sure)}/{len(sure)} right; wrong verdicts at {wrong}")
            print("\n".join(calibration_table(rows)))
        print_rules(outcomes)
        return
    trees = (
        [local_source(p) for p in args.source]
        if args.source
        else [get_source(v) for v in ("0.5.23", "0.5.9")]
    )
    for tree in trees:
        t0 = time.perf_counter()
        index = load_index(tree, rebuild=args.rebuild)
        built = time.perf_counter() - t0
        label = "built (cold)" if args.rebuild else "opened (warm; --rebuild to time a build)"
        print(f"sglang {tree.version}: index {label} in {built:.2f} s, {len(index.catalog)} flags")
        scan = rg_seconds(tree.root, r"def |class ")
        if scan is not None:
            print(f"  rg over the tree (every def/class): {scan:.3f} s; index / rg = {built / scan:.0f}x")
        firsts, agains, freshes, rgs = [], [], [], []
        for flag in FLAGS:
            t0 = time.perf_counter()
            verdict = analyze_flag(index, flag, FACTS)
            firsts.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            analyze_flag(index, flag, FACTS)
            agains.append(time.perf_counter() - t0)
            seconds, _ = fresh(tree.root, flag)
            freshes.append(seconds)
            rgs.append(rg_seconds(tree.root, flag.lstrip("-").replace("-", "_")) or float("nan"))
            print(
                f"  {flag:40} fresh process {freshes[-1]:.3f} s, in-process first {firsts[-1]:.3f} s, "
                f"again {agains[-1]:.3f} s  -> {verdict.verdict}"
            )
        print(
            f"  median: fresh process {statistics.median(freshes):.3f} s (max {max(freshes):.3f} s), "
            f"in-process first {statistics.median(firsts):.3f} s, again {statistics.median(agains):.3f} s"
        )
        ratios = [f / r for f, r in zip(freshes, rgs, strict=True) if r == r and r > 0]
        if ratios:
            print(
                f"  rg for the flag's name: median {statistics.median(rgs):.3f} s; one flag in a fresh process / "
                f"rg = median {statistics.median(ratios):.1f}x (max {max(ratios):.1f}x)"
            )


if __name__ == "__main__":
    main()
