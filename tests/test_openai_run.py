"""A full `optagent run` driven by a hostile scripted model over real HTTP (issue 26).

The scripted OpenAI-compatible server (tests/fixtures/openai_script.py) plays planner and
researchers: list the candidates, research four flags in parallel subagents (one a flag that does
not exist, with invented evidence; every researcher also tries a path traversal), then a run of bad
requests (a trial skipping research, a lossy flag, shell metacharacters, a value of the wrong type,
a misspelt flag, the nonexistent flag, an unknown tool, extra arguments), then a kept trial and a
rejected one, and a conclusion. Every bad request must be refused at zero restarts and the run must
reach its end with the report written.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from agent.session import RunOptions, run_session
from agent.transcripts.load import load_transcript
from agent.transcripts.transcript import Transcript
from agent.ui import RunUI
from tests.fixtures.openai_script import ScriptedLLM, calls, say, steps_done, tool_call
from tests.fixtures.sim import free_port
from tools.bench.objective import read_goal

pytestmark = pytest.mark.slow(seconds=150)

DCG, SPEC, KV, TURBO = (
    "--disable-cuda-graph",
    "--speculative-num-steps",
    "--kv-cache-dtype",
    "--turbo-mode-xyz",
)


def _researcher(body: dict, flag: str) -> dict:
    step = steps_done(body)
    if flag == TURBO:  # looks it up, is told it does not exist, claims the code says it applies
        if step == 0:
            return calls(tool_call("lookup", {"flag": flag}, "l"))
        verdict = {
            "flag": flag, "verdict": "applies", "summary": "turbo mode makes everything faster",
            "evidence": [{"location": "python/sglang/srt/server_args.py:1", "quote": "turbo = True"}],
            "decided_by": "code", "certainty": 0.95,
        }  # fmt: skip
        return calls(tool_call("final_result", verdict, "f"))
    if step == 0:
        return calls(
            tool_call("usage", {"flag": flag}, "u"),
            tool_call("read_range", {"path": "../../../../etc/passwd", "start": 1, "end": 5}, "r"),
        )
    usage = next(
        json.loads(m["content"])
        for m in body["messages"]
        if m["role"] == "tool" and "code_verdict" in m["content"]
    )
    evidence = [{"location": r["location"], "quote": r["text"]} for r in usage["readers"][:1]]
    # on the lossy flag the model contradicts the code, on purpose
    verdict = "dead" if flag == KV and usage["code_verdict"] != "dead" else usage["code_verdict"]
    out = {"flag": flag, "verdict": verdict, "summary": f"from usage: {usage['code_summary'][:80]}",
           "evidence": evidence, "decided_by": "code", "certainty": 0.9}  # fmt: skip
    return calls(tool_call("final_result", out, "f"))


def _trial(n: int, flag: str, value: str | None = None, action: str = "set", **extra: object) -> dict:
    args = {"changes": [{"flag": flag, "value": value, "action": action}], "reason": "scripted", **extra}
    return tool_call("run_trial", args, n)


def _planner(body: dict, marker: Path) -> dict:
    bad = f"0.9; touch {marker}"
    script = [
        calls(tool_call("list_candidates", {}, 0)),
        calls(
            tool_call(
                "todo_write", {"items": [{"id": "all", "content": "research", "status": "in_progress"}]}, 1
            ),
            *[tool_call("research_flag", {"flag": f}, f"r{i}") for i, f in enumerate((DCG, SPEC, KV, TURBO))],
        ),
        calls(_trial(2, "--cuda-graph-max-bs-decode", "64")),  # skipping research
        calls(_trial(3, KV, "fp8_e4m3", override_reason="the model insists it is harmless")),  # lossy
        calls(_trial(4, "--mem-fraction-static", bad)),  # metacharacters
        calls(_trial(5, "--served-model-name", f"$(touch {marker})")),
        calls(_trial(6, SPEC, "three")),  # wrong type
        calls(_trial(7, "--speculative-num-step", "1")),  # misspelt: did you mean
        calls(_trial(8, TURBO, override_reason="research says it applies")),  # not a flag
        calls(tool_call("shell_exec", {"cmd": f"touch {marker}"}, 9)),  # unknown tool
        calls(_trial(10, DCG, action="unset", sudo=True)),  # extra argument
        calls(_trial(11, DCG, action="unset")),  # kept
        calls(_trial(12, SPEC, "1", override_reason="fewer draft steps may pay off")),  # worse: rolled back
    ]
    step = steps_done(body)
    return script[step] if step < len(script) else say("Conclusion: scripted run finished.")


def _answer(marker: Path):  # noqa: ANN202
    def answer(body: dict) -> dict:
        names = {t["function"]["name"] for t in body.get("tools", [])}
        if "usage" in names:
            first = next(m for m in body["messages"] if m["role"] == "user")["content"]
            flag = next(f for f in (DCG, SPEC, KV, TURBO) if f in str(first))
            return _researcher(body, flag)
        return _planner(body, marker)

    return answer


@pytest.fixture
def seed_no_graphs(tmp_path: Path, sglang_0523):
    """A fast simulated seed host whose baseline runs without CUDA graphs (a large, sure gain)."""
    from sim import host
    from tools.deploy.units.file import UnitFile

    cfg = host.create(tmp_path / "sim", scenario="seed", port=free_port(), time_scale=0.03)
    for unit in (tmp_path / "sim" / "sglang.service", tmp_path / "sim" / "local" / "sglang.service"):
        unit.write_text(UnitFile.load(unit).set_flag(DCG).render())
    cfg = host.ensure_up(tmp_path / "sim")
    bench = {
        "concurrency": [1, 2],
        "input_len": 256,
        "output_len": 64,
        "prompts_per_level": 12,
        "warmup": 1,
        "reps": 3,
        "spread_launches": 0,  # every restart is a trial's: the declared launch spread, none measured
    }
    cfg = cfg.model_copy(
        update={
            "research": cfg.research.model_copy(update={"source_dir": sglang_0523.root}),
            "bench": cfg.bench.model_copy(update=bench),
        }
    )
    yield cfg
    host.down(tmp_path / "sim")


def test_hostile_model_is_refused_at_zero_restarts_and_the_run_ends(
    tmp_path: Path, seed_no_graphs, sglang_0523, monkeypatch
):
    from tools.deploy.units.file import UnitFile

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    cfg, marker = seed_no_graphs, tmp_path / "pwned"
    transcript = Transcript.create(
        tmp_path / "tx", kind="run", goal="improve throughput", model="m", target="sim"
    )
    console = Console(width=160, record=True)
    with ScriptedLLM(_answer(marker), key="sk-test-secret") as llm:
        opts = RunOptions(
            goal=read_goal("improve throughput"), model="openai:scripted", base_url=llm.base_url, max_trials=8
        )
        try:
            result = asyncio.run(run_session(cfg, opts, RunUI(console, transcript)))
        finally:
            transcript.close({"status": "test"})
    out = console.export_text()
    tx = load_transcript(transcript.path)

    assert result.status == "completed", (result.status, out[-3000:])
    assert result.conclusion == "Conclusion: scripted run finished."
    assert result.report is not None and Path(result.report).exists()
    assert not marker.exists()
    assert {r["model"] for r in llm.requests} == {"scripted"}  # the bare name went over the wire

    # every bad request refused before any restart; only the two real trials restarted the server
    refusals = [e["data"] for e in tx.events_of("refusal")]
    assert [r["check"] for r in refusals] == [
        "research",
        "catalog",
        "catalog",
        "catalog",
        "catalog",
        "catalog",
    ], refusals
    assert "did you mean --speculative-num-steps" in refusals[4]["why"]
    assert "expects an integer" in refusals[3]["why"] and "not a flag of sglang" in refusals[5]["why"]
    trials = [e["data"] for e in tx.events_of("trial")]
    lossy = [t for t in trials if t["changes"][0]["flag"] == KV]
    assert lossy and lossy[0]["restarts"] == 0 and "lossy" in lossy[0]["why"]
    real = [t for t in trials if t["deployed"]]
    assert [(t["changes"][0]["flag"], t["decision"]) for t in real] == [(DCG, "kept"), (SPEC, "rolled_back")]
    assert result.restarts == sum(t["restarts"] for t in real)
    assert all(t["restarts"] == 0 for t in trials if not t["deployed"])
    flags = UnitFile.parse(Path(cfg.target.remote_unit).read_text()).command.flags
    assert DCG not in flags and flags.get(SPEC) == "3"  # the kept change stays, the worse one went

    # the unknown tool, the extra argument and the path traversal went back to the model as retries
    returned = " ".join(
        json.dumps(m["content"]) for r in llm.requests for m in r["messages"] if m["role"] == "tool"
    )
    assert (
        "shell_exec" in returned
        and "extra_forbidden" in returned
        and "no such file in the source tree" in returned
    )

    # claims: the invented verdict is relabelled; the lossy flag's contradiction is decided by the code
    verdicts = {e["data"]["flag"]: e["data"] for e in tx.events_of("verdict")}
    assert set(verdicts) == {DCG, SPEC, KV, TURBO}
    assert verdicts[TURBO]["verdict"] == "incompatible-with-version" and verdicts[TURBO]["evidence"] == []
    assert any("relabelled" in c for c in verdicts[TURBO]["checked"])
    assert verdicts[KV]["verdict"] != "dead" and any("disagreement" in c for c in verdicts[KV]["checked"])
    assert "claim checked" in out

    # requests and tokens per agent: in the transcript and printed at the end
    usage = [e["data"] for e in tx.events_of("usage") if e["data"]["agent"] != "run"]
    assert {u["agent"] for u in usage} == {"planner", *(f"researcher:{f}" for f in (DCG, SPEC, KV, TURBO))}
    assert sum(u["requests"] for u in usage) == len(llm.requests)
    assert sum(u["input_tokens"] for u in usage) == llm.prompt_tokens
    assert re.search(r"model usage: .*planner: \d+ requests", out) and "researcher: " in out
    prompts = [
        r["messages"][0]["content"]
        for r in llm.requests
        if "usage" in {t["function"]["name"] for t in r["tools"]}
    ]
    assert max(len(p.encode()) for p in prompts) <= 6 * 1024
    researcher_prompt = max(prompts, key=len)
    # and for every flag of the version, on this deployment's facts
    from agent.policy.researcher import facts_for
    from prompts import render
    from tools.research.flags import flag_catalog

    context = tx.events_of("context")[0]["data"]
    sizes = {
        f.name: len(
            render("researcher.md.j2", facts=facts_for(context["facts"], f.name), context=context).encode()
        )
        for f in flag_catalog(sglang_0523)
    }
    assert max(sizes.values()) <= 6 * 1024, sorted(sizes.items(), key=lambda kv: kv[1])[-3:]
    print(f"\nhostile run: {len(refusals)} refusals + lossy, restarts {result.restarts}, "
          f"requests {len(llm.requests)}, input tokens {llm.prompt_tokens}, researcher prompt {len(researcher_prompt)} B")  # fmt: skip


def _stubborn(body: dict) -> dict:
    """A planner that researches one flag, then lists the candidates forever; a researcher that
    reads outside the source tree forever."""
    names = {t["function"]["name"] for t in body.get("tools", [])}
    n = steps_done(body)
    if "usage" in names:
        return calls(tool_call("read_range", {"path": "../../../etc/passwd", "start": 1, "end": 3}, n))
    if n == 0:
        return calls(tool_call("research_flag", {"flag": DCG}, n))
    return calls(tool_call("list_candidates", {}, n))


@pytest.mark.parametrize("limit", ["tool errors", "tokens"])
def test_a_run_ends_cleanly_on_its_own_limits(tmp_path: Path, seed_no_graphs, monkeypatch, limit: str):
    """Tool errors past the run's bound, or the token budget spent: the run stops on that limit, its
    report is written and the target is untouched (before: one refused path ended it as failed)."""
    monkeypatch.setenv("OPENAI_API_KEY", "none")
    transcript = Transcript.create(tmp_path / "tx", kind="run", goal="g", model="m", target="sim")
    console = Console(width=160, record=True)
    unit = Path(seed_no_graphs.target.remote_unit).read_text()
    with ScriptedLLM(_stubborn) as llm:
        opts = RunOptions(
            goal=read_goal("improve throughput"), model="scripted", base_url=llm.base_url, dry_run=True,
            max_tokens=None if limit == "tool errors" else 60_000,
        )  # fmt: skip
        try:
            result = asyncio.run(run_session(seed_no_graphs, opts, RunUI(console, transcript)))
        finally:
            transcript.close({"status": "test"})
    assert result.status.startswith("limit:") and not result.failed, result.status
    assert ("tool errors in this run" if limit == "tool errors" else "token") in result.status
    assert result.report is not None and Path(result.report).exists()
    assert Path(seed_no_graphs.target.remote_unit).read_text() == unit
    if limit == "tool errors":  # retried three times, then told to stop, until the run's bound
        returned = [m["content"] for r in llm.requests for m in r["messages"] if m["role"] == "tool"]
        assert any("do not repeat the call" in c for c in returned)
        assert len([r for r in llm.requests if "usage" in {t["function"]["name"] for t in r["tools"]}]) > 30
    else:
        spent = sum(e["data"]["input_tokens"] + e["data"]["output_tokens"]
                    for e in load_transcript(transcript.path).events_of("usage") if e["data"]["agent"] != "run")  # fmt: skip
        assert 60_000 < spent < 60_000 + 20_000


def _short_script(body: dict) -> dict:
    names = {t["function"]["name"] for t in body.get("tools", [])}
    n = steps_done(body)
    if "usage" in names:  # the researcher: the code's verdict, as the model's own
        if n == 0:
            return calls(tool_call("usage", {"flag": DCG}, 1))
        usage = next(json.loads(m["content"]) for m in body["messages"] if m["role"] == "tool")
        return calls(tool_call("final_result", {"flag": DCG, "verdict": usage["code_verdict"],
                                                "summary": "from the code", "decided_by": "model"}, 2))  # fmt: skip
    if n == 0:
        return calls(tool_call("research_flag", {"flag": DCG}, 3))
    return say("Conclusion: would remove --disable-cuda-graph.")


def test_optagent_run_with_model_and_base_url(tmp_path: Path, seed_no_graphs) -> None:
    """`optagent run --model NAME --base-url URL`, the README's command, against a server that
    serves NAME: the bare name goes over the wire, the transcript names `NAME @ URL`."""
    import os
    import subprocess
    import sys

    cfg = seed_no_graphs
    toml = "\n".join(
        [f"[{section}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in data.items() if v is not None)
         for section, data in (
             ("target", cfg.target.model_dump(mode="json")),
             ("bench", cfg.bench.model_dump(mode="json")),
             ("research", {"source_dir": str(cfg.research.source_dir)}),
             ("agent", {"transcripts_dir": str(tmp_path / "tx")}),
         )]
    )  # fmt: skip
    (tmp_path / "optagent.toml").write_text(toml + "\n")
    with ScriptedLLM(_short_script) as llm:
        out = subprocess.run(
            [sys.executable, "-c", "import sys; from agent.cli.main import app; app(sys.argv[1:])",
             "run", "--config", "optagent.toml", "--model", "openai:scripted", "--base-url", llm.base_url,
             "--dry-run", "--max-tokens", "500000"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
            env={**os.environ, "COLUMNS": "200", "OPENAI_API_KEY": "none"},
        )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert {r["model"] for r in llm.requests} == {"scripted"}
    path = Path(re.search(r"transcript: (\S+)", out.stdout).group(1))
    assert path.parent == tmp_path / "tx", path
    tx = load_transcript(path)
    assert tx.header["model"] == f"scripted @ {llm.base_url}"
    assert "openai:" not in out.stdout and re.search(r"model usage: planner: \d+ requests", out.stdout)
    assert "Conclusion: would remove --disable-cuda-graph." in out.stdout
    [verdict] = tx.events_of("verdict")
    assert verdict["data"]["decided_by"] == "code"  # the model's reading agreed with the code's analysis
