"""The playbook: known SGLang levers (`agent/playbook.toml`) checked against this deployment's facts."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent.conditions import _COMPARISON, ConditionResult, check_all

PLAYBOOK_PATH = Path(__file__).with_name("playbook.toml")
PRIORITY_ORDER = {"high": 0, "medium": 1, "low": 2}
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][\w.]*)\}")


class Replacement(BaseModel):
    """The flag a newer SGLang replaced a deprecated one with."""

    flag: str
    value: str | None = None


class Lever(BaseModel):
    """One known optimization lever."""

    model_config = ConfigDict(extra="forbid")

    flag: str
    value: str | None = None
    action: Literal["set", "unset"] = "set"
    what: str
    helps: str
    needs: list[str] = Field(default_factory=list)
    conflicts: list[str] = Field(default_factory=list)
    risk: str = ""
    lossy: bool = False
    priority: Literal["high", "medium", "low"] = "medium"
    replaced_by: Replacement | None = None


class Candidate(BaseModel):
    """A lever resolved for this deployment: the exact change and the checked conditions."""

    flag: str
    value: str | None
    action: Literal["set", "unset"]
    lever: Lever
    needs: list[dict[str, Any]]
    conflicts: list[dict[str, Any]]
    status: Literal["candidate", "no-op", "incompatible", "not-in-version", "already-set"]
    note: str = ""

    @property
    def change(self) -> str:
        """`--flag value`, `--flag` or `unset --flag`."""
        if self.action == "unset":
            return f"unset {self.flag}"
        return self.flag if self.value is None else f"{self.flag} {self.value}"


def load_playbook(path: Path = PLAYBOOK_PATH) -> list[Lever]:
    """Read the playbook file; a malformed lever raises `ValueError` naming it."""
    data = tomllib.loads(Path(path).read_text())
    levers = []
    for i, raw in enumerate(data.get("lever", [])):
        try:
            levers.append(Lever.model_validate(raw))
        except ValueError as e:
            raise ValueError(f"{path}: lever {i + 1} ({raw.get('flag', '?')}): {e}") from e
    return levers


def _fill(value: str | None, facts: dict[str, Any]) -> str | None:
    if value is None:
        return None

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in facts:
            raise KeyError(m.group(1))
        return str(facts[m.group(1)])

    return _PLACEHOLDER.sub(sub, value)


def _as_dicts(results: list[ConditionResult]) -> list[dict[str, Any]]:
    return [{"condition": r.condition, "actual": r.actual, "outcome": r.outcome} for r in results]


def _resolve_conditions(conditions: list[str], facts: dict[str, Any]) -> list[str]:
    """`server.cuda_graph_max_bs < bench.max_concurrency`: a fact on the right is filled in first."""
    out = []
    for cond in conditions:
        m = _COMPARISON.match(cond)
        if m and m.group(3) in facts:
            cond = f"{m.group(1)} {m.group(2)} {facts[m.group(3)]!r}"
        out.append(cond)
    return out


def evaluate(
    levers: list[Lever], facts: dict[str, Any], catalog: dict[str, Any] | None = None
) -> list[Candidate]:
    """Resolve each lever against the facts and the version's flag catalog, in priority order.

    `catalog` maps `--flag` to its catalog entry (anything with `deprecated`); None skips the check.
    """
    out: list[Candidate] = []
    for lever in sorted(levers, key=lambda lv: PRIORITY_ORDER[lv.priority]):
        flag, value, note = lever.flag, lever.value, ""
        if catalog is not None and lever.replaced_by is not None:
            entry = catalog.get(flag)
            if entry is None or getattr(entry, "deprecated", False):
                note = f"{flag} is deprecated or absent in this version; using {lever.replaced_by.flag}"
                flag, value = lever.replaced_by.flag, lever.replaced_by.value
        try:
            value = _fill(value, facts)
        except KeyError as e:
            value, note = None, f"value needs the missing fact {e.args[0]}"
        needs = check_all(_resolve_conditions(lever.needs, facts), facts)
        conflicts = check_all(_resolve_conditions(lever.conflicts, facts), facts)
        status = "candidate"
        current = facts.get("flag." + flag.lstrip("-").replace("-", "_"), "<unset>")
        if catalog is not None and flag not in catalog:
            status, note = "not-in-version", f"{flag} is not a flag of this SGLang version"
        elif lever.action == "set" and current != "<unset>" and (value is None or str(current) == value):
            status, note = "already-set", f"{flag} is already set to {current!r}"
        elif lever.action == "unset" and current == "<unset>":
            status, note = "already-set", f"{flag} is not set; nothing to remove"
        elif any(r.outcome == "pass" for r in conflicts):
            status = "incompatible"
            note = "; ".join(r.describe() for r in conflicts if r.outcome == "pass")
        elif any(r.outcome == "fail" for r in needs):
            status = "no-op"
            note = "; ".join(r.describe() for r in needs if r.outcome == "fail")
        out.append(
            Candidate(
                flag=flag,
                value=value,
                action=lever.action,
                lever=lever,
                needs=_as_dicts(needs),
                conflicts=_as_dicts(conflicts),
                status=status,
                note=note,
            )
        )
    return out
