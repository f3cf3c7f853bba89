"""The research subagent: checks one flag in the version-matched SGLang source, returns a `FlagVerdict`."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent, RunContext

from agent.context import DeploymentContext
from agent.policy.playbook import Candidate
from agent.policy.toolerrors import ErrorBudget, ToolErrors
from agent.policy.verdict import FlagVerdict
from prompts import render
from tools.flagname import flag_dest, flag_name

MAX_MATCHES = 40
_AST_LOCK = threading.Lock()
"""CPython 3.11's `ast` is not safe to run in several threads at once (SystemError: AST constructor
recursion depth mismatch); the code search of concurrent researchers takes turns."""


@dataclass
class ResearchDeps:
    """What a researcher can look at: the deployment's facts, the source tree and the playbook."""

    ctx: DeploymentContext
    candidates: dict[str, Candidate] = field(default_factory=dict)
    flag: str | None = None
    """The flag this researcher checks (its prompt carries the facts that bear on it)."""
    code: dict[str, dict[str, Any]] = field(default_factory=dict)
    """`usage` results of this session by flag: the code's analysis, which alone decides `code`."""
    errors: ErrorBudget = field(default_factory=ErrorBudget)


def lookup_flag(deps: ResearchDeps, flag: str) -> dict[str, Any]:
    """The catalog entry of `flag` in this SGLang version and the playbook's checked conditions."""
    flag = flag_name(flag)
    out: dict[str, Any] = {"flag": flag, "sglang_version": deps.ctx.version}
    if not deps.ctx.catalog:
        out["catalog"] = f"unavailable: {deps.ctx.missing.get('source', 'no catalog')}"
    else:
        entry = deps.ctx.catalog.get(flag)
        if entry is None:  # `--no-x`, `--x_y`, aliases: the catalog's own lookup
            from tools.research.catalog import find_flag

            entry = find_flag([e for e in deps.ctx.catalog.values() if hasattr(e, "aliases")], flag)
        if entry is None:
            out["catalog"] = f"{flag} is not a flag of SGLang {deps.ctx.version}"
            out["in_catalog"] = False
        else:
            info = dataclasses.asdict(entry) if dataclasses.is_dataclass(entry) else dict(vars(entry))
            out["catalog"] = {k: v for k, v in info.items() if v not in (None, "")}
            out["in_catalog"] = True
    cand = deps.candidates.get(flag)
    if cand is not None:
        out["playbook"] = {
            "what": cand.lever.what,
            "helps": cand.lever.helps,
            "risk": cand.lever.risk,
            "lossy": cand.lever.lossy,
            "value": cand.value,
            "needs": cand.needs,
            "conflicts": cand.conflicts,
            "status": cand.status,
        }
    return out


def flag_usage(deps: ResearchDeps, flag: str) -> dict[str, Any]:
    """The code's verdict on `flag` here: its definition, every serving-path reader with its guards
    checked against this deployment (three-valued), the exits it reaches, and why (issue 10)."""
    flag = flag_name(flag)
    if deps.ctx.tree is None:
        return {"flag": flag, "error": f"no source tree: {deps.ctx.missing.get('source', 'unknown')}"}
    from tools.research.analysis import analyze_flag
    from tools.research.index import load_index

    cand = deps.candidates.get(flag)
    value = cand.value if cand is not None else None
    try:
        with _AST_LOCK:
            index = load_index(deps.ctx.tree)
            startup = deps.ctx.startup(flag, value)  # SGLang's own start-up, with and without it
            code = analyze_flag(index, flag, deps.ctx.facts, value=value, startup=startup)
            if getattr(startup, "note", ""):  # it ran without bubblewrap: what isolated it instead
                code.notes.append(startup.note)
    except (ValueError, OSError, sqlite3.Error) as e:  # a damaged index: say so, research goes on
        return {"flag": flag, "error": f"{type(e).__name__}: {e}"}
    out = _usage_result(code)
    deps.code[flag] = out
    return out


def _usage_result(code: Any) -> dict[str, Any]:
    readers = [
        {
            "location": f.location,
            "text": f.text,
            "function": f.function,
            "state": f.state,
            "why": f.why,
            "checks": f.conditions,
            "exits": [
                {"location": e.location, "kind": e.kind, "message": e.message, "fires": e.truth, "via": e.via}
                for e in f.exits
                if e.truth is not False
            ][:5],
        }
        for f in code.findings
    ]
    return {
        "flag": code.flag,
        "definition": code.definition,
        "help": code.help,
        "dest": code.dest,
        "researched_as": code.researched_as,
        "code_verdict": code.verdict,
        "code_summary": code.summary,
        "certainty": code.certainty,
        "rests_on": f"{code.rule}/{code.basis}",  # the rule and what it rests on: its certainty's record
        "unsettled": code.unsettled,  # what the deployment's facts did not settle (certainty <= 0.6)
        "readers": readers,
        "notes": code.notes,
    }


def grep_source(deps: ResearchDeps, pattern: str, glob: str | None = None) -> dict[str, Any]:
    """Regex search over the SGLang source of the running version (bounded)."""
    if deps.ctx.tree is None:
        return {"error": "no source tree"}
    from tools.research.flag_index.serving_path import off_path_reason
    from tools.research.search import grep

    res = grep(deps.ctx.tree, pattern, glob=glob, max_results=MAX_MATCHES)
    prefix = deps.ctx.tree.rel(deps.ctx.tree.package_dir) + "/"

    def shown(m: Any) -> str:
        why = (
            off_path_reason(m.path.removeprefix(prefix))
            if m.path.startswith(prefix)
            else "outside the package"
        )
        return f"{m.path}:{m.line}: {m.text.strip()}" + (f"  [not serving code: {why}]" if why else "")

    return {"matches": [shown(m) for m in res.matches], "truncated": res.truncated}


def read_source(deps: ResearchDeps, path: str, start: int, end: int) -> str:
    """Lines `start`..`end` of `path` (relative to the source root), numbered."""
    if deps.ctx.tree is None:
        return "no source tree"
    from tools.research.search import read_range

    return read_range(deps.ctx.tree, path, start, min(end, start + 200))


RETRIES = 3
MAX_RELATED = 24
"""Server arguments in a researcher's prompt: the flag's own, then those sharing most words with it."""
_COMMON = frozenset({"enable", "disable", "max", "min", "size", "mode", "num", "use", "server", "path"})


def facts_for(facts: dict[str, Any], flag: str | None) -> dict[str, Any]:
    """The facts that bear on `flag`: the model, GPUs, version, benchmark and the unit's flags, and
    the resolved server arguments that share most words with it (every other server argument is
    one `deployment_facts` call away)."""
    dest = flag_dest(flag or "")
    words = {w for w in dest.split("_") if len(w) > 2 and w not in _COMMON}
    out, related = {}, []
    for k, v in facts.items():
        if not k.startswith("server."):  # model, GPUs, version, benchmark, the unit's own flags
            out[k] = v
            continue
        name = k.split(".", 1)[1]
        shared = len(words & set(name.split("_")))
        if name == dest or shared:
            related.append((name != dest, -shared, k))
    for _, _, k in sorted(related)[:MAX_RELATED]:
        out[k] = facts[k]
    return out


def build_researcher(model: Any) -> Any:
    """The researcher agent (pydantic-ai), output type `FlagVerdict`."""
    agent = Agent(
        model,
        name="researcher",
        deps_type=ResearchDeps,
        output_type=FlagVerdict,
        instructions=lambda ctx: render(
            "researcher.md.j2",
            facts=facts_for(ctx.deps.ctx.facts, ctx.deps.flag),
            context=ctx.deps.ctx.summary(),
        ),
        retries=RETRIES,
        capabilities=[ToolErrors()],
    )

    @agent.tool
    async def lookup(ctx: RunContext[ResearchDeps], flag: str) -> dict[str, Any]:
        """The flag's catalog entry (type, default, help, deprecated) and the playbook's conditions checked here."""
        return lookup_flag(ctx.deps, flag)

    @agent.tool
    async def usage(ctx: RunContext[ResearchDeps], flag: str) -> dict[str, Any]:
        """The code's verdict: definition, serving-path readers with guards checked against the model and
        GPUs (pass/fail/unknown), start-up refusals they reach, and whether anything acts on the flag."""
        return await asyncio.to_thread(flag_usage, ctx.deps, flag)

    @agent.tool
    async def grep(ctx: RunContext[ResearchDeps], pattern: str, glob: str | None = None) -> dict[str, Any]:
        """Regex search in the version-matched SGLang source; `glob` limits files, e.g. 'srt/layers/**/*.py'."""
        return await asyncio.to_thread(grep_source, ctx.deps, pattern, glob)

    @agent.tool
    async def read_range(ctx: RunContext[ResearchDeps], path: str, start: int, end: int) -> str:
        """Read lines start..end (at most 200) of a source file, with line numbers."""
        return await asyncio.to_thread(read_source, ctx.deps, path, start, end)

    @agent.tool
    async def deployment_facts(ctx: RunContext[ResearchDeps], prefix: str = "") -> dict[str, Any]:
        """Model, GPU, interconnect and server-arg facts of this deployment; `prefix` keeps only the
        keys that start with it (e.g. 'server.' for every resolved server argument)."""
        return {k: v for k, v in ctx.deps.ctx.facts.items() if k.startswith(prefix)}

    return agent
