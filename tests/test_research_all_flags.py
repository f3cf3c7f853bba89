"""Every flag of the real 0.5.23 and 0.5.9 wheels (a third of them, spread over the catalog) gets a
verdict in the shared vocabulary, with evidence on the serving path only; flags no issue names."""

from __future__ import annotations

from collections import Counter

import pytest

from agent.policy.verdict import VERDICTS
from tests.test_research_labels import profile_facts
from tools.research.analysis import analyze_flag
from tools.research.flag_index.serving_path import off_path_reason
from tools.research.index import load_index


@pytest.mark.slow(seconds=55)
def test_every_flag_gets_a_verdict_from_the_code(sglang_0523, sglang_059):
    facts = profile_facts("story")
    for tree in (sglang_0523, sglang_059):
        index = load_index(tree)
        kinds: Counter[str] = Counter()
        for info in index.catalog[::3]:
            v = analyze_flag(index, info.name, facts)
            kinds[v.verdict] += 1
            assert v.verdict in VERDICTS and v.summary, info.name
            assert 0.0 <= v.certainty <= 1.0
            for f in v.findings:
                assert off_path_reason(index.package_rel(f.location.rsplit(":", 1)[0])) is None, f.location
            if v.verdict == "dead":
                assert all(f.state == "off" for f in v.findings), info.name
            if v.verdict == "refuses-to-start":
                assert any(
                    e.truth is True and e.kind in ("raise", "assert") for f in v.findings for e in f.exits
                )
        # a real catalog is mostly live, with some dead and some off flags, never all one verdict
        assert kinds["applies"] > len(index.catalog[::3]) // 3, (tree.version, kinds)
        assert kinds["dead"] >= 1 and kinds["no-op"] >= 1, (tree.version, kinds)
