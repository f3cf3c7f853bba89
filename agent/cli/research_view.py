"""How `optagent research` gathers facts and prints a code verdict (one vocabulary with the agent)."""

from __future__ import annotations

from typing import Any

from agent.cli.common import console
from agent.transcripts.verdicts import plain_condition


def facts_of(cfg: Any, model: Any, hardware: Any) -> dict[str, Any]:
    """The same flat facts the agent uses (`DeploymentContext.facts`), plus the unit file's flags as
    `server.<dest>` when a config names the unit file."""
    from agent.context import DeploymentContext

    unit_flags: dict[str, str | None] = {}
    if cfg is not None:
        try:
            from tools.deploy.units.file import UnitFile

            unit_flags = dict(UnitFile.load(cfg.target.local_unit).command.flags)
        except (OSError, ValueError):
            unit_flags = {}
    facts = DeploymentContext(unit_flags=unit_flags, model=model, hardware=hardware).facts
    for key, value in list(facts.items()):
        if key.startswith("flag."):
            facts["server." + key[5:]] = value
    facts.pop("bench.max_concurrency", None)
    return facts


def print_verdict(v: Any, tree: Any, facts: dict[str, Any]) -> None:
    """The verdict, why, then each reader with its state, checked conditions and exits."""
    out = console.print
    out(f"[bold]{v.flag}[/] in sglang {tree.version} ({tree.origin})", highlight=False)
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
    out(f"[bold]verdict[/]: {v.verdict} (code, certainty {v.certainty:.2f})", highlight=False)
    out(f"  {v.summary}", highlight=False, markup=False)
