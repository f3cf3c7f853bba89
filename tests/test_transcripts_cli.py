"""`optagent transcripts list/show/review/export` on sessions written by the real writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from agent.cli.main import app
from agent.transcripts.export import KEPT_COLOR, ROLLED_COLOR
from tests.transcript_sessions import write_session

pytestmark = pytest.mark.server

runner = CliRunner()


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    d = tmp_path_factory.mktemp("transcripts")
    good = write_session(d)
    cut = write_session(d, truncate=True)
    return d, good.stem, cut.stem


def _run(*args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return r.exit_code, r.stdout, r.stderr


def test_list_json_and_table(sessions: tuple[Path, str, str]) -> None:
    d, good, cut = sessions
    code, out, _ = _run("transcripts", "list", "--dir", str(d), "--json")
    assert code == 0
    rows = {r["id"]: r for r in json.loads(out)}
    assert set(rows) == {good, cut}
    assert rows[good]["status"] == "done" and rows[good]["messages"] == 8
    assert rows[good]["kept"] == ["--cuda-graph-max-bs 256"]
    assert rows[good]["throughput_change"] == "1: +0.0%  8: +7.8%  64: +12.4%"
    assert rows[cut]["status"].startswith("damaged at line ")
    code, out, _ = _run("transcripts", "list", "--dir", str(d), "-n", "1")
    assert code == 0 and out.count("improve throughput") == 1 and "kept --cuda-graph-max-bs 256" in out


def test_show_whole_session(sessions: tuple[Path, str, str]) -> None:
    d, good, _ = sessions
    code, out, _ = _run("transcripts", "show", good, "--dir", str(d))
    assert code == 0
    lines = out.splitlines()
    assert any(line.startswith("[msg 1] planner · user") for line in lines)
    assert any(line.startswith("    [msg 3] researcher:--cuda-graph-max-bs · user") for line in lines)
    assert "→ research_flag" in out and "chars folded" in out
    assert "SGLang version: 0.5.23" in out and "8 x NVIDIA H100 80GB HBM3" in out
    assert "[x] research --cuda-graph-max-bs (high)" in out
    assert "--enable-torch-compile: rolled back" in out and "2,270.0" in out and "+12.4%" in out
    assert "python/sglang/srt/model_executor/model_runner.py:412" in out


def test_show_one_message_and_json(sessions: tuple[Path, str, str]) -> None:
    d, good, _ = sessions
    code, out, _ = _run("transcripts", "show", good[:-1], "--dir", str(d), "--msg", "4", "--context", "0")
    assert code == 0 and "[msg 4]" in out and "[msg 3]" not in out and "[msg 5]" not in out
    code, out, err = _run("transcripts", "show", good, "--dir", str(d), "--msg", "99")
    assert code == 2 and "no message 99" in err and "1..8" in err
    code, out, _ = _run(
        "transcripts", "show", good, "--dir", str(d), "--json", "--msg", "2", "--context", "1"
    )
    data = json.loads(out)
    assert [m["msg"] for m in data["messages"]] == [1, 2, 3] and data["events"][0]["kind"] == "verdict"


def test_review(sessions: tuple[Path, str, str]) -> None:
    d, good, cut = sessions
    code, out, _ = _run("transcripts", "review", good, "--dir", str(d), "--markdown")
    assert code == 0
    for needle in (
        "## Context found",
        "- SGLang version: 0.5.23",
        "| 64 | 2,020.0 | 114.0 | 36.0 |",
        "  - research --enable-torch-compile: pending -> cancelled",
        "- final list:\n  - [x] research --cuda-graph-max-bs (high)\n  - [-] research --enable-torch-compile (medium)",
        "| --cuda-graph-max-bs | **applies** | +throughput at high concurrency | memory |",
        "- --cuda-graph-max-bs: `python/sglang/srt/model_executor/model_runner.py:412` if self.server_args",
        "- --cuda-graph-max-bs: 1 checked: 1 pass",
        "### Trial 1: --cuda-graph-max-bs 256 — **kept**",
        "- Trial 2 (--enable-torch-compile): regressed: -8.0% at 64",
        "| 64 | 2,020.0 | 2,270.0 | +12.4% |",
    ):
        assert needle in out, needle
    code, out, err = _run("transcripts", "review", cut, "--dir", str(d), "--markdown")
    assert code == 0 and "line 15: truncated line" in err
    assert "status: damaged at line 15" in out and "### Trial 1:" in out and "### Trial 2:" not in out


def test_review_json(sessions: tuple[Path, str, str]) -> None:
    d, good, cut = sessions
    code, out, _ = _run("transcripts", "review", good, "--dir", str(d), "--json")
    assert code == 0
    data = json.loads(out)
    assert data["id"] == good and data["status"] == "done" and data["context"]["version"] == "0.5.23"
    assert data["kept"] == ["--cuda-graph-max-bs 256"]
    assert [t["decision"] for t in data["trials"]] == ["kept", "rolled back"]
    assert data["trials"][0]["candidate"]["64"] == pytest.approx(2270.0)
    assert data["gain"]["64"] == pytest.approx([2020.0, 2270.0])
    assert data["error"] is None and "analysis" not in data
    code, out, _ = _run("transcripts", "review", cut, "--dir", str(d), "--json")
    data = json.loads(out)
    assert code == 0 and data["status"].startswith("damaged at line 15") and len(data["trials"]) == 1


def test_review_narrate_without_llm_says_so(
    sessions: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    d, good, _ = sessions
    code, out, err = _run("transcripts", "review", good, "--dir", str(d), "--narrate", "--markdown")
    assert code == 0 and "no LLM is configured" in err and "## Analysis" in out and "## Trials" in out


def test_bad_ids_and_formats(sessions: tuple[Path, str, str], tmp_path: Path) -> None:
    d, good, _ = sessions
    code, _, err = _run("transcripts", "show", "nope", "--dir", str(d))
    assert code == 2 and "no transcript 'nope'" in err
    code, _, err = _run("transcripts", "export", good, "--dir", str(d), "--format", "pdf")
    assert code == 2 and "use md or html" in err
    junk = tmp_path / "junk.jsonl"
    junk.write_text("hello\n")
    code, _, err = _run("transcripts", "review", str(junk), "--dir", str(d))
    assert code == 2 and "not an optagent transcript" in err
    code, out, _ = _run("transcripts", "list", "--dir", str(tmp_path / "empty"))
    assert code == 0 and "no transcripts" in out


def test_export_markdown(sessions: tuple[Path, str, str], tmp_path: Path) -> None:
    d, good, _ = sessions
    out_file = tmp_path / "s.md"
    code, _, err = _run("transcripts", "export", good, "--dir", str(d), "--format", "md", "-o", str(out_file))
    assert code == 0 and "wrote" in err
    text = out_file.read_text()
    assert text.startswith(f"# optagent session {good}") and "## Final gain per concurrency level" in text


def _color_mask(img: np.ndarray, hex_color: str, tol: int = 40) -> np.ndarray:
    rgb = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)])
    return np.abs(img[:, :, :3].astype(int) - rgb).sum(axis=2) < tol


def test_html_export_renders_plot_and_trial_table_in_chromium(
    sessions: tuple[Path, str, str], tmp_path: Path
) -> None:
    import subprocess

    d, good, _ = sessions
    page, shot = tmp_path / "s.html", tmp_path / "s.png"
    code, _, _ = _run("transcripts", "export", good, "--dir", str(d), "--format", "html", "-o", str(page))
    assert code == 0
    html = page.read_text()
    assert 'src="data:image/png;base64,' in html and "<script" not in html
    subprocess.run(
        [
            "/usr/bin/chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'ud'}",
            f"--screenshot={shot}",
            "--window-size=1200,2000",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    img = np.asarray(Image.open(shot).convert("RGB"))
    frame = _color_mask(img, "#8250df")  # the border drawn around the embedded plot
    ys, xs = np.nonzero(frame)
    assert len(ys) > 1000, "plot frame not rendered"
    top, bottom, left, right = ys.min(), ys.max(), xs.min(), xs.max()
    assert bottom - top > 200 and right - left > 600
    inside = img[top + 5 : bottom - 5, left + 5 : right - 5]
    assert _color_mask(inside, KEPT_COLOR).sum() > 2000  # the final line and the kept bar
    assert _color_mask(inside, ROLLED_COLOR).sum() > 2000  # the rolled-back bar
    assert _color_mask(inside, "#0969da").sum() > 300  # the baseline line
    above = img[:top]
    assert _color_mask(above, KEPT_COLOR).sum() > 200  # the 'kept' badge in the trial table
    assert _color_mask(above, ROLLED_COLOR).sum() > 200  # the 'rolled back' badge
    assert (above < 100).all(axis=2).sum() > 2000  # the table's text


def test_transcripts_commands_do_not_import_the_agent_stack(sessions: tuple[Path, str, str]) -> None:
    import subprocess
    import sys

    d, good, _ = sessions
    code = (
        "import sys; from agent.cli.main import app\n"
        "try: app(sys.argv[1:])\n"
        "except SystemExit: pass\n"
        "print(sorted(m for m in ('pydantic_ai', 'openai', 'matplotlib') if m in sys.modules))"
    )
    for cmd in (
        ["list", "--dir", str(d)],
        ["review", good, "--dir", str(d)],
        ["show", good, "--dir", str(d)],
    ):
        out = subprocess.run(
            [sys.executable, "-c", code, "transcripts", *cmd], capture_output=True, text=True, check=True
        )
        assert out.stdout.strip().endswith("[]"), cmd


def test_list_and_review_keep_every_column_at_80_columns(sessions: tuple[Path, str, str]) -> None:
    import re

    d, good, cut = sessions
    listed = runner.invoke(app, ["transcripts", "list", "--dir", str(d)], env={"COLUMNS": "80"})
    assert listed.exit_code == 0 and max(map(len, listed.stdout.splitlines())) <= 80
    flat = re.sub(r"\s+", "", listed.stdout)
    for field in (good, cut, "improvethroughput", "builtin", "sim", "kept--cuda-graph-max-bs256", "msgs"):
        assert field in flat, field
    assert (
        len(listed.stdout.splitlines()) <= 16
    )  # two sessions; was one row over 12 lines, the outcome dropped
    shown = runner.invoke(app, ["transcripts", "review", good, "--dir", str(d)], env={"COLUMNS": "80"})
    assert shown.exit_code == 0 and "…" not in shown.stdout.split("Research verdicts")[1].split("Evidence")[0]
    assert "--cuda-graph-max-bs" in re.sub(r"\s+", "", shown.stdout.split("Research verdicts")[1])


def test_show_rounds_the_numbers_people_read(tmp_path: Path) -> None:
    import re

    from tests.transcript_sessions import write_paired_run

    path, _ = write_paired_run(tmp_path)
    with path.open("a") as f:  # a tool's result as the model saw it, and an outcome, with raw floats
        f.write(json.dumps({"type": "event", "kind": "note", "msg": None, "ts": "2026-12-03T14:00:00+00:00",
                            "data": {"ratio": 1.0667476760695331, "tok_s": 2470.121002707761}}) + "\n")  # fmt: skip
    shown = runner.invoke(app, ["transcripts", "show", str(path), "--fold", "4000"], env={"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    assert "1.067" in shown.stdout and "2470.1" in shown.stdout
    assert not re.findall(r"\d\.\d{5,}", shown.stdout), re.findall(r"\d\.\d{5,}", shown.stdout)[:5]


def test_show_gives_before_and_after_on_the_users_workload_with_intervals(tmp_path: Path) -> None:
    """The final check in `show` reads as in the report and the review: the baseline at the start
    against the configuration left deployed, per level, with each change's interval; not the
    final block's tok/s alone."""
    import re

    from agent.transcripts.before_after import FINAL_CHECK
    from agent.transcripts.load import load_transcript
    from agent.transcripts.review import build_review
    from agent.transcripts.transcript import Transcript
    from tests.transcript_sessions import sweep
    from tools.config import BenchConfig

    bench = BenchConfig(concurrency=[1, 64], input_len=1024, output_len=128).model_dump(mode="json")
    t = Transcript.create(tmp_path, kind="run", goal="improve throughput", model="builtin", target="sim",
                          config={"bench": bench})  # fmt: skip
    spread = [0.99, 1.0, 1.01]
    t.event("baseline", {"reps": [{**sweep({1: 125.0 * s, 64: 1164.0 * s}), "seed": i}
                                  for i, s in enumerate(spread)]})  # fmt: skip
    t.event("final", {"reps": [{**sweep({1: 125.5 * s, 64: 1297.0 * s}), "seed": i}
                               for i, s in enumerate(reversed(spread))], "source": FINAL_CHECK})  # fmt: skip
    t.close({"kept": ["--enable-mixed-chunk"], "status": "completed"})
    ba = build_review(load_transcript(t.path)).before_after  # what the report and the review show
    assert ba is not None and [lv.concurrency for lv in ba.levels] == [1, 64]

    shown = runner.invoke(app, ["transcripts", "show", str(t.path)], env={"COLUMNS": "120"})
    assert shown.exit_code == 0, shown.output
    out = shown.stdout
    final = out.split("● final", 1)[1].split("\nend ", 1)[0]
    words = " ".join(final.split())
    assert words.startswith(
        "Your workload (random prompts (1024 tokens in), 128 tokens out): the baseline"
    ), final
    assert "from the final check" in words
    for lv in ba.levels:  # both sides and the change with its interval, as the review has them
        assert re.search(
            rf"\n\s*{lv.concurrency}\s+{lv.before:,.1f}\s+{lv.after:,.1f}\s+{re.escape(lv.change())}\s+3 / 3\s*\n",
            final,
        ), final
    assert re.fullmatch(r"\+11\.4% \[\+\d+\.\d\.\.\+\d+\.\d\]", ba.level_at(64).change())
    assert "not paired" in final
