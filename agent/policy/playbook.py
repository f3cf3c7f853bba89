"""The playbook: known SGLang levers (`agent/policy/playbook.toml`) checked against this deployment's facts."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent.policy.conditions import ConditionResult, check_all
from agent.policy.sizing import Ladder, Sizes, ladder
from tools.bench.workload import Mechanism
from tools.flagname import flag_dest

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
    mechanism: list[Mechanism] = Field(default_factory=list)
    """What it acts on (`tools.bench.workload.Mechanism`); a lever on cache, scheduling or memory is
    judged on a workload with shared prefixes (`workload_for`). Empty: not said (the trial falls
    back on research's readers of the flag, then on its name)."""
    needs: list[str] = Field(default_factory=list)
    state: list[str] = Field(default_factory=list)
    """Conditions on the running server's state and the benchmark's load (speculative decoding is
    on; the KV pool is too small for the highest level). Unlike `needs` (claims about what the code
    does, which research may overrule), a failed one makes the lever pointless here whatever the
    code says."""
    conflicts: list[str] = Field(default_factory=list)
    acts_at: list[str] = Field(default_factory=list)
    """Conditions on a measured level's `level.*` facts (`agent.policy.loadstate`) under which the
    lever's mechanism acts there (none: every level). A bundle member with no mechanism at the
    level that won is doubtful."""
    costs_at: list[str] = Field(default_factory=list)
    """Conditions on a measured level's `level.*` facts under which the lever costs there (the other
    side of its trade-off; none: no known cost). Such a lever is tried alone, never in a bundle: its
    loss at that level would sink the members it went with without saying whose it was."""
    raise_when: list[str] = Field(default_factory=list)
    """Conditions on the baseline's `state.*` facts that make the lever worth more here."""
    lower_when: list[str] = Field(default_factory=list)
    """Conditions on the baseline's `state.*` facts that make it worth less here."""
    risk: str = ""
    expected_gain: float | None = Field(None, ge=0)
    """The gain it may bring where it acts, when its priority's (high 6%, medium 4%, low 2%) would
    overstate it (a bookkeeping saving)."""
    lossy: bool = False
    priority: Literal["high", "medium", "low"] = "medium"
    replaced_by: Replacement | None = None
    sizes: Sizes | None = None
    """A sized lever: its value is searched along a ladder (`agent.policy.sizing`), the playbook's
    value first."""


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
    ladder: Ladder | None = None
    """The values a sized lever's search may try here (None: not a sized lever, or its value or a
    bound is not known)."""

    @property
    def ruled_out(self) -> str:
        """Why the playbook rules this candidate out, in words that mean one thing: `already set:
        --x is already set to '64'`, `nothing to remove: --x is not set`, `pointless here: ...`,
        `incompatible: not usable when ...`, `no effect here: needs ...` ('' for a candidate)."""
        if self.status == "candidate":
            return ""
        if self.status == "already-set":
            if self.note.startswith(("nothing to remove", "pointless")) or "already set" in self.note:
                return self.note
            return f"already set: {self.note}"
        word = {"no-op": "no effect here", "not-in-version": "not in this version"}.get(
            self.status, self.status
        )
        return f"{word}: {self.note}" if self.note else word

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
        needs = check_all(lever.needs, facts)
        off = [r for r in check_all(lever.state, facts) if r.outcome == "fail"]
        conflicts = check_all(lever.conflicts, facts)
        status = "candidate"
        current = facts.get("flag." + flag_dest(flag), "<unset>")
        if catalog is not None and flag not in catalog:
            status, note = "not-in-version", f"{flag} is not a flag of this SGLang version"
        elif lever.action == "set" and current != "<unset>" and (value is None or str(current) == value):
            status, note = "already-set", f"{flag} is already set to {current!r}"
        elif lever.action == "unset" and current == "<unset>":
            status, note = "already-set", f"nothing to remove: {flag} is not set"
        elif off:
            status = "already-set"  # nothing to gain in this state: not researched, not trialled
            note = "pointless on this server and load: it helps only when " + "; ".join(
                r.plain() for r in off
            )
        elif any(r.outcome == "pass" for r in conflicts):
            status = "incompatible"
            note = "not usable when " + "; ".join(r.plain() for r in conflicts if r.outcome == "pass")
        elif any(r.outcome == "fail" for r in needs):
            status = "no-op"
            note = "needs " + "; ".join(r.plain() for r in needs if r.outcome == "fail")
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
                ladder=_ladder(lever, value, facts.get("server." + flag_dest(flag)), facts),
            )
        )
    return out


def _ladder(lever: Lever, value: str | None, current: Any, facts: dict[str, Any]) -> Ladder | None:
    if lever.sizes is None or lever.action != "set":
        return None
    return ladder(lever.sizes, value, current, lambda template: _fill(template, facts))


def grid_size(levers: list[Lever], facts: dict[str, Any], catalog: dict[str, Any] | None = None) -> int:
    """Levers a one-at-a-time grid would deploy here (and roll back): every lever that is a flag of
    this version and not set already, whatever the server's state makes of it."""
    every = evaluate([lv.model_copy(update={"state": []}) for lv in levers], facts, catalog)
    return sum(c.status in ("candidate", "no-op", "incompatible") for c in every)
