"""How `optagent research` gathers facts and prints a code verdict (one vocabulary with the agent):
the deployment it used and what it could not read, then the verdict."""

from __future__ import annotations

from typing import Any

from agent.cli.common import console
from agent.transcripts.verdicts import plain_condition
from tools.research.startup.check import MODEL_FLAGS


def facts_of(ctx: Any, *, deployed: bool) -> dict[str, Any]:
    """The flat facts a run's researcher reasons over (`DeploymentContext.facts`). Where the server
    did not answer (or no deployment was read), the unit file's flags stand for its resolved
    arguments as `server.<dest>`."""
    facts = dict(ctx.facts)
    if not deployed or "server_info" in ctx.missing:
        for key, value in list(facts.items()):
            if key.startswith("flag."):
                facts["server." + key[5:]] = value
    if not deployed:
        facts.pop("bench.max_concurrency", None)
    return facts


def deployment_view(cfg: Any, ctx: Any, why_none: str | None, tree: Any) -> dict[str, Any]:
    """Which deployment research used and what it read of it (JSON-able): the endpoint and unit
    file, SGLang's version, the model and GPUs, and each piece that could not be read with why."""
    if ctx is None:
        return {
            "used": False,
            "why": why_none or "no deployment configured (optagent.toml or `optagent sim up`)",
        }
    target = cfg.target
    model, hardware = ctx.model, ctx.hardware
    out: dict[str, Any] = {
        "used": True,
        "endpoint": target.endpoint,
        "unit_file": str(target.local_unit),
        "simulated": bool(cfg.simulated),
        "sglang_version": ctx.server_info.get("version"),
        "model_path": next((ctx.unit_flags[f] for f in MODEL_FLAGS if ctx.unit_flags.get(f)), None),
        "model": model.summary() if hasattr(model, "summary") else None,
        "gpus": hardware.summary() if hasattr(hardware, "summary") else None,
        "missing": dict(ctx.missing),
    }
    running = out["sglang_version"]
    if running and running != tree.version:
        out["note"] = f"the server runs SGLang {running}; the code read is {tree.version}'s"
    return out


def _deployment_lines(d: dict[str, Any]) -> list[str]:
    if not d.get("used"):
        return [f"deployment: none used: {d.get('why')}; the facts are the options given"]
    kind = "the simulated deployment" if d.get("simulated") else "the configured deployment"
    version = f"SGLang {d['sglang_version']}" if d.get("sglang_version") else "SGLang version not read"
    lines = [f"deployment: {kind} at {d['endpoint']} (unit file {d['unit_file']}), {version}"]
    if d.get("model"):
        lines.append(f"  model: {d['model']} (config.json of {d.get('model_path')})")
    if d.get("gpus"):
        lines.append(f"  GPUs: {d['gpus']}")
    for piece, why in (d.get("missing") or {}).items():
        label, then = _PIECES.get(piece, (piece, ""))
        lines.append(f"  not read: {label} ({why})" + (f"; {then}" if then else ""))
    if d.get("note"):
        lines.append(f"  note: {d['note']}")
    return lines


_PIECES = {
    "server_info": (
        "the server's resolved arguments from /get_server_info",
        "the unit file's flags stand in",
    ),
    "model": ("the model's config.json", "SGLang's own start-up cannot run (--model-config gives one)"),
    "hardware": ("the GPUs", "--gpu-sm, --gpus, --gpu-name and --gpu-memory give them"),
    "unit_flags": ("the unit file", "its flags are not among the facts"),
    "source": ("the running version's source", ""),
}
"""What each piece a deployment did not give means for the research (`DeploymentContext.missing`)."""


def print_verdict(
    v: Any,
    tree: Any,
    facts: dict[str, Any],
    *,
    decided_by: str = "code",
    deployment: dict[str, Any] | None = None,
) -> None:
    """The verdict, why, then each reader with its state, checked conditions and exits; first which
    deployment's facts were used (`deployment_view`)."""
    out = console.print
    out(f"[bold]{v.flag}[/] in sglang {tree.version} ({tree.origin})", highlight=False)
    for line in _deployment_lines(deployment or {"used": False}):
        out(f"  {line}", highlight=False, markup=False)
    if v.definition:
        out(f"  defined at {v.definition}", highlight=False)
    if v.help:
        out(f"  help: {v.help}", highlight=False, markup=False)
    shown = {
        k: facts[k] for k in ("gpu.sm", "gpu.count", "server.tp_size", "model.architecture") if k in facts
    }
    out(
        f"  facts: {shown or 'none given (--gpu-sm, --gpus, --tp, --model-config, --server-arg)'}",
        markup=False,
    )
    out(f"[bold]readers[/] ({len(v.findings)}):", highlight=False)
    for f in v.findings:
        out(f"  [{f.state}] {f.location} in {f.function}: {f.why}", highlight=False, markup=False)
        for c in f.conditions[:6]:
            check = plain_condition(str(c["condition"]), str(c["fact"]), str(c["outcome"]))
            out(f"      check {check}", highlight=False, markup=False)
        for e in [e for e in f.exits if e.truth is not False][:3]:
            fires = {True: "fires here", None: "may fire"}[e.truth]
            out(f"      {e.kind} at {e.location} ({fires}): {e.message}", highlight=False, markup=False)
    for note in v.notes:
        out(f"  note: {note}", highlight=False, markup=False)
    out(f"[bold]verdict[/]: {v.verdict} ({decided_by}, certainty {v.certainty:.2f})", highlight=False)
    out(f"  {v.summary}", highlight=False, markup=False)
    if getattr(v, "rule", ""):  # the rule's record on the taught labels gives the certainty
        from tools.research.verdict.decide import BASES

        out(f"  rests on: {BASES.get(v.basis, v.basis)} (rule {v.rule})", highlight=False, markup=False)
    if getattr(v, "unsettled", ""):
        out(f"  not settled: {v.unsettled}", highlight=False, markup=False)
