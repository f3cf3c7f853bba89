"""`optagent chat` shows its prompt at once (issue 28 item 3): no baseline benchmark before `you>`
(it used to take ~100 s on the seed deployment); a step that needs no baseline (status, research)
does not measure one either. The real CLI on a pseudo-terminal against the simulated deployment."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.test_chat_e2e import _on_a_terminal, _transcripts, deployment  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow(seconds=90)


def test_the_prompt_comes_before_any_benchmark(deployment: Path) -> None:  # noqa: F811
    from agent.transcripts.load import load_transcript

    d = deployment
    started = time.monotonic()
    child = _on_a_terminal(d, "chat", "--config", "optagent.toml")
    try:
        child.expect("you>")
        to_prompt = time.monotonic() - started
        shown = child.before
        [chat] = _transcripts(d)
        loaded = load_transcript(Path(chat["path"]))
        assert not loaded.events_of("baseline"), "a baseline was measured before the prompt"
        assert "baseline benchmark" not in shown and "baseline: c=" not in shown
        assert "baseline: measured before the first trial (not now: the prompt comes at once)" in shown
        child.sendline("/status")
        child.expect("last benchmark: none yet")
        child.expect("you>")
        child.sendline("research --disable-cuda-graph")
        child.expect("I researched --disable-cuda-graph")
        shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", child.before)  # the terminal's colours
        # the verdict's own line, with the seconds its research took; no baseline for research
        assert re.search(r"--disable-cuda-graph: [\w-]+ \(code, certainty [\d.]+, \d+ s\)", shown), shown
        child.expect("you>")
        assert "measuring the baseline" not in shown + child.before
        child.sendline("/exit")
        child.expect("resume with")
    finally:
        child.close(force=True)
    loaded = load_transcript(Path(chat["path"]))
    assert not loaded.events_of("baseline") and loaded.events_of("verdict")
    print(f"seconds to the prompt: {to_prompt:.1f}")
