"""Research on hostile source trees: the index build's time, peak memory and output, per tree.

Usage: python benchmarks/bench_research_bounds.py [--source DIR] [--big N] [--deep N] [--workers W]
                                                  [--only real|big|deep|real+big]

Four trees, each indexed cold in a fresh interpreter (`python -c`), which then researches one flag
(`--tp-size` on a real tree, `--enable-foo` on the small one) and prints one JSON line of figures:
`build_s`, `build_peak_mb` (peak resident memory when the build is done), `research_s`, `peak_mb`
(with the research too), `index_mb` (the index file), `json_mb` and `findings` (the verdict as
`optagent research --json` prints it) and the notes naming what was left unread. The trees:
- `real`: the SGLang tree (`--source`, else the cached 0.5.23 one), its serving-path files and bytes;
- `big`: a small SGLang-shaped tree plus `--big` files just under the per-file cap (4 MiB), each
  dense with functions that read the flag (two reads, a `raise` and a call per ~150 bytes);
- `real+big`: the real tree with those same files added (is the real code still read?);
- `deep`: the small tree plus one file holding a `--deep`-term sum of the flag's reads.

Peak memory is the build process's own `VmHWM` (/proc/self/status): with `--workers 1` (the
default here) the whole build (parse, walk, write) runs in that one process; `ru_maxrss` would carry
the forking parent's figure across `exec`. `--workers 2` is what `optagent` uses; its workers' own
peaks are not in the figure then.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLAG = "--enable-foo"

SMALL = {
    "srt/server_args.py": """
        import argparse
        from dataclasses import dataclass

        @dataclass
        class ServerArgs:
            enable_foo: bool = False
            tp_size: int = 1

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--enable-foo", action="store_true", help="Foo.")
                parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size)
        """,
    "srt/layers/foo.py": """
        def use_foo(server_args):
            if server_args.enable_foo:
                return 1
            return 0
        """,
}

CHILD = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from tools.research.analysis import analyze_flag
from tools.research.index import build_index
from tools.research.source import local_source

tree = local_source(Path({src!r}), version={version!r})
db = Path({db!r})
start = time.perf_counter()
index = build_index(tree, db, workers={workers})
build = time.perf_counter() - start
build_peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
start = time.perf_counter()
verdict = analyze_flag(index, {flag!r}, {{"gpu.sm": 90, "gpu.count": 1}})
research = time.perf_counter() - start
text = json.dumps(verdict.to_dict(), default=str)
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({{
    "build_s": round(build, 1), "research_s": round(research, 1),
    "build_peak_mb": int(build_peak.split()[1]) // 1024, "peak_mb": int(hwm.split()[1]) // 1024,
    "index_mb": round(db.stat().st_size / 2**20, 1),
    "json_mb": round(len(text) / 2**20, 2), "verdict": verdict.verdict, "findings": len(verdict.findings),
    "notes": [n[:160] for n in verdict.notes if n.startswith(("not read", "only the first"))],
}}))
"""


def dense_file(size: int, tag: str) -> str:
    """A Python file of about `size` bytes: functions that read the flag, raise and call."""
    parts, total, i = [], 0, 0
    while total < size - 200:
        block = (
            f"def f_{tag}_{i}(server_args):\n"
            f"    if server_args.enable_foo and server_args.tp_size > {i}:\n"
            f"        raise ValueError('no {i}')\n"
            f"    return g_{tag}_{i}(server_args.enable_foo)\n\n"
        )
        parts.append(block)
        total += len(block)
        i += 1
    return "".join(parts)


def deep_file(terms: int) -> str:
    return (
        "def f(server_args):\n    x = " + " + ".join(["server_args.enable_foo"] * terms) + "\n    return x\n"
    )


def write_small(src: Path) -> None:
    for rel, text in SMALL.items():
        path = src / "sglang" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def run(name: str, src: Path, workers: int, flag: str = FLAG, version: str | None = "9.9.9") -> dict:
    db = src.parent / "index.sqlite"
    code = CHILD.format(root=str(ROOT), src=str(src), db=str(db), workers=workers, flag=flag, version=version)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["?"]
        return {"tree": name, "error": last[0][:200]}
    return {"tree": name, **json.loads(done.stdout.strip().splitlines()[-1])}


def serving_bytes(src: Path) -> tuple[int, int]:
    sys.path.insert(0, str(ROOT))
    from tools.research.flag_index.serving_path import off_path_reason

    pkg = src / "sglang"
    files = [p for p in pkg.rglob("*.py") if not off_path_reason(p.relative_to(pkg).as_posix())]
    return len(files), sum(p.stat().st_size for p in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, help="an SGLang tree (a directory holding sglang/)")
    parser.add_argument("--big", type=int, default=5, help="files just under 4 MiB to add")
    parser.add_argument("--deep", type=int, default=1000, help="terms of the deep expression")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--only", choices=["real", "big", "deep", "real+big"], action="append")
    args = parser.parse_args()
    only = set(args.only or ["real", "big", "deep", "real+big"])
    if args.source is None:
        sys.path.insert(0, str(ROOT))
        from tools.research.cache import cache_root
        from tools.research.source import get_source

        args.source = get_source("0.5.23", cache_dir=cache_root()).root
    big_size = 4 * 2**20 - 4096
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-bounds-") as tmp:
        if "real" in only:
            files, size = serving_bytes(args.source)
            print(f"real tree {args.source}: {files} serving-path files, {size / 2**20:.1f} MiB")
            work = Path(tmp) / "real"
            shutil.copytree(args.source / "sglang", work / "src" / "sglang")
            rows.append(run("real", work / "src", args.workers, "--tp-size", None))
        if "big" in only:
            work = Path(tmp) / "big"
            write_small(work / "src")
            for i in range(args.big):
                (work / "src" / "sglang" / "srt" / f"gen_{i}.py").write_text(dense_file(big_size, str(i)))
            rows.append(run(f"big x{args.big}", work / "src", args.workers))
        if "real+big" in only:
            work = Path(tmp) / "realbig"
            shutil.copytree(args.source / "sglang", work / "src" / "sglang")
            for i in range(args.big):
                (work / "src" / "sglang" / "srt" / f"gen_{i}.py").write_text(dense_file(big_size, str(i)))
            rows.append(run(f"real+big x{args.big}", work / "src", args.workers, "--tp-size", None))
        if "deep" in only:
            work = Path(tmp) / "deep"
            write_small(work / "src")
            (work / "src" / "sglang" / "srt" / "deep.py").write_text(deep_file(args.deep))
            rows.append(run(f"deep {args.deep}", work / "src", args.workers))
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
