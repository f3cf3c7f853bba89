"""`optagent run --json`: stdout carries one JSON summary and nothing else; progress goes to stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _config_file(sim_host, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    from sim.host import ensure_up

    t = sim_host().target
    ensure_up(tmp_path / "sim")
    lines = ["[target]"]
    lines += [f"{k} = {json.dumps(str(getattr(t, k)))}" for k in ("local_unit", "remote_unit", "endpoint")]
    lines += ["[agent]", f"transcripts_dir = {json.dumps(str(tmp_path / 'tx'))}"]
    lines += ["[bench]", "concurrency = [1, 8]", "input_len = 64", "output_len = 16",
              "prompts_per_level = 8", "warmup = 0", "reps = 2"]  # fmt: skip
    path = tmp_path / "optagent.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_run_json_prints_only_the_summary_on_stdout(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = _config_file(sim_host, tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", "from agent.cli.main import app; app()", "run", "--config", str(config), "--dry-run", "--json",
         "--max-trials", "1"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[1]), "HOME": str(Path.home())},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)  # nothing but the JSON
    assert summary["status"] == "completed" and summary["deployed"] == [] and summary["kept"] == []
    assert summary["restarts"] == 0 and isinstance(summary["seconds"], int)
    assert "wall-time budget" in summary["budget"] and summary["untried"]
    assert Path(summary["transcript"]).exists() and Path(summary["report"]).exists()
    assert "transcript:" in done.stderr and "done in" in done.stderr
    assert "model usage" not in done.stderr  # the builtin policy calls no model (issue 51)
    # the todo says what became of the trial it would have run, not an empty reason
    assert "dry run — nothing deployed" in " ".join(done.stderr.split())
    assert "not run — " not in done.stderr
