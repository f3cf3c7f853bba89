"""The HTML export of a large session, checked in headless Chromium at 1280 px: short, no horizontal
scroll, condition dumps collapsed; the plot names trials; the review keeps evidence paths whole."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from agent.transcripts.export import export_html, plot_figure, plot_png
from agent.transcripts.load import load_transcript
from agent.transcripts.markdown import review_markdown
from agent.transcripts.review import build_review
from agent.transcripts.transcript import Transcript
from tests.transcript_sessions import sweep

pytestmark = pytest.mark.server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def keep(path: Path) -> None:
    """Copy a screenshot to `$OPTAGENT_SCREENSHOTS` (when set) for a human to look at."""
    target = os.environ.get("OPTAGENT_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)


LONG_PATH = "python/sglang/srt/layers/attention/flashinfer_mla_backend_with_a_rather_long_module_name.py"
MEASURE = (
    "<script>window.addEventListener('load', () => document.body.setAttribute('data-m', JSON.stringify({"
    "h: document.documentElement.scrollHeight, w: document.documentElement.scrollWidth,"
    " cw: document.documentElement.clientWidth, text: document.body.innerText})));</script>"
)


def big_session(directory: Path) -> Path:
    """A run with 16 researched flags (40 conditions each, mostly unknown) and 8 trials."""
    t = Transcript.create(directory, kind="run", goal="improve throughput", model="builtin", target="sim")
    t.event("approval", {"yes": True, "dry_run": False, "allow_lossy": False, "simulated": True})
    t.event("context", {"version": "0.5.23", "flags": {"--tp-size": "4"}})
    base = {1: 100.0, 8: 700.0, 64: 2000.0}
    t.event("baseline", {"reps": [sweep(base), sweep({c: v * 1.01 for c, v in base.items()})]})
    for i in range(16):
        conditions = [
            {"condition": f"model.attribute_{k} == expected_{k}", "fact": "unknown (not in config.json)",
             "outcome": "unknown"}
            for k in range(38)
        ] + [{"condition": "gpu.sm >= 90", "fact": "gpu.sm = 120", "outcome": "pass"},
             {"condition": "attention_backend == fa3", "fact": "attention_backend = triton", "outcome": "fail"}]  # fmt: skip
        t.event(
            "verdict",
            {"flag": f"--flag-number-{i}", "verdict": "applies", "summary": "read",
             "evidence": [{"location": f"{LONG_PATH}:{100 + i}", "quote": "if server_args.flag_number: " + "x" * 200}],
             "conditions": conditions, "expected_effect": "more throughput at high concurrency", "risk": "memory"},
        )  # fmt: skip
    ratios = [1.08, 0.93, 1.0, 1.12, 0.85, 1.03, 0.97, 1.005]
    for n, r in enumerate(ratios, start=1):
        kept = r == 1.12
        t.event(
            "trial",
            {"number": n, "kind": "single",
             "changes": [{"flag": f"--flag-number-{n}", "value": str(n * 16), "action": "set"}],
             "decision": "kept" if kept else "rolled_back", "why": f"ratio {r}",
             "comparison": {"verdict": "improved" if r > 1.02 else "regressed" if r < 0.98 else "inconclusive"},
             "levels": {str(c): v * r for c, v in base.items()}},
        )  # fmt: skip
    t.close({"kept": ["--flag-number-4 64"], "status": "done"})
    return t.path


def render(page: Path, out: Path, width: int = 1280) -> dict:
    """Load `page` in headless Chromium at `width` px; its measurements, and a full-page screenshot."""
    probe = page.with_suffix(".measure.html")
    probe.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--virtual-time-budget=5000"]  # fmt: skip
    dom = subprocess.run([*base, f"--window-size={width},900", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    found = re.search(r'data-m="([^"]*)"', dom.stdout)
    assert found, dom.stderr[-2000:]
    metrics = json.loads(html.unescape(found.group(1)))
    shot = subprocess.run([*base, f"--window-size={width},{metrics['h']}", f"--screenshot={out}", page.as_uri()],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.exists(), shot.stderr[-2000:]
    return metrics


def png_size(path: Path) -> tuple[int, int]:
    w, h = struct.unpack(">II", path.read_bytes()[16:24])
    return w, h


@pytest.fixture
def big(tmp_path: Path):  # type: ignore[no-untyped-def]
    return load_transcript(big_session(tmp_path))


def test_html_export_fits_1280px_and_stays_short(big, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    page = tmp_path / "session.html"
    page.write_text(export_html(big))
    shot = tmp_path / "export-1280.png"
    m = render(page, shot)
    keep(shot)
    assert m["w"] <= m["cw"] == 1280  # no horizontal scroll
    assert m["h"] < 6500, m["h"]  # was 26,000 px for a session like this
    assert png_size(shot) == (1280, m["h"])
    lines = [line for line in m["text"].splitlines() if line.strip()]
    unknown = [line for line in lines if "unknown" in line.lower()]
    assert len(unknown) / len(lines) < 0.25, (len(unknown), len(lines))
    # The full condition lists are there, collapsed: 16 x 40 list items inside <details>.
    assert page.read_text().count('<li class="unknown">') == 16 * 38
    assert page.read_text().count("<details>") == 16
    assert LONG_PATH + ":100" in m["text"]  # evidence paths whole, not cut

    # The same page with every <details> open is far taller: the collapsing is what keeps it short.
    opened = tmp_path / "open.html"
    opened.write_text(page.read_text().replace("<details>", "<details open>"))
    assert render(opened, tmp_path / "open.png")["h"] > 2 * m["h"]


def test_plot_names_trials_whole_fits_and_has_no_empty_legend_entries(big, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    review = build_review(big)
    fig = plot_figure(review)
    curves, bars = fig.axes
    # the kept trial's candidate is drawn on the left; every legend entry names something drawn
    legend = [t.get_text() for t in curves.get_legend().get_texts()]
    assert legend == ["baseline (start of run)", "#4 kept candidate"], legend  # no intervals recorded
    labels = [t.get_text().replace("\n", "") for t in bars.get_xticklabels()]
    assert labels[:2] == ["#1 flag-number-1 16", "#2 flag-number-2 32"] and not any("…" in x for x in labels)
    by_trial: dict[int, set[str]] = {}
    for p in bars.patches:  # 8 trials x 3 levels, grouped around x = trial index
        by_trial.setdefault(round(p.get_x() + p.get_width() / 2), set()).add(to_hex(p.get_facecolor()))
    assert by_trial[0] == {"#1a7f37"} and by_trial[3] == {"#1a7f37"}  # better
    assert by_trial[1] == {"#cf222e"} and by_trial[4] == {"#cf222e"}  # worse
    assert by_trial[2] == {"#8c959f"}  # within ±1%
    drawn = {to_hex(p.get_facecolor()) for p in bars.patches}
    entries = {t.get_text(): to_hex(h.get_facecolor()) for t, h in
               zip(bars.get_legend().get_texts(), bars.get_legend().legend_handles, strict=True)}  # fmt: skip
    assert all(colour in drawn or name == "kept" for name, colour in entries.items()), entries
    kept = [p for p in bars.patches if p.get_linewidth() == 2]
    assert len(kept) == 3 and all(to_hex(p.get_edgecolor()) == "#000000" for p in kept)  # trial 4, 3 levels
    # titles, axis labels and tick labels fit inside the figure
    fig.canvas.draw()
    box = fig.bbox
    for ax in fig.axes:
        for text in [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels()]:
            ext = text.get_window_extent()
            assert ext.x0 >= box.x0 - 1 and ext.x1 <= box.x1 + 1 and ext.y0 >= box.y0 - 1, text.get_text()
    plt.close(fig)
    png = plot_png(review)
    assert png is not None and png[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "export-plot.png").write_bytes(png)
    keep(tmp_path / "export-plot.png")


def test_review_lists_evidence_paths_whole_and_no_false_decline(big) -> None:  # type: ignore[no-untyped-def]
    text = review_markdown(build_review(big))
    assert f"`{LONG_PATH}:100`" in text
    assert "declined" not in text and "Run: started with --yes; lossy changes not allowed" in text
    assert (
        "40 checked: 1 fail, 1 pass, 38 unknown; fails: attention_backend == fa3 (here triton): does not hold"
        in text
    )
    assert text.count("model.attribute_0 ==") == 0  # unknown conditions are counted, not dumped


@pytest.mark.parametrize("command", ["review", "show"])
def test_the_terminal_views_show_evidence_paths_whole(tmp_path: Path, command: str) -> None:
    path = big_session(tmp_path)
    result = subprocess.run(
        [shutil.which("optagent") or "optagent", "transcripts", command, path.stem, "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "120"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"{LONG_PATH}:115" in result.stdout  # on one line, not cut or folded with an ellipsis
