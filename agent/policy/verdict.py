"""`FlagVerdict`: the researcher's structured answer about one flag, with `path:line` evidence.

One verdict vocabulary for the CLI, the agent, transcripts and reports (issue 10, item 6):
`applies`, `no-op`, `dead`, `refuses-to-start`, `incompatible-with-version`, `unknown`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

Verdict = Literal["applies", "no-op", "dead", "refuses-to-start", "incompatible-with-version", "unknown"]
VERDICTS: tuple[str, ...] = (
    "applies",
    "no-op",
    "dead",
    "refuses-to-start",
    "incompatible-with-version",
    "unknown",
)
REJECTED: frozenset[str] = frozenset({"no-op", "dead", "refuses-to-start", "incompatible-with-version"})
"""Verdicts under which a trial would be wasted (no restart is spent on them)."""
DOUBT = 0.6
"""At or below this certainty a code verdict rests on something research could not settle."""
_OLD_NAMES = {"incompatible": "incompatible-with-version", "live": "applies", "refuses": "refuses-to-start"}


class Evidence(BaseModel):
    """A quoted source line: `path:line` relative to the SGLang source root."""

    location: str = Field(description="path:line relative to the source tree root")
    quote: str = Field(description="the quoted line, verbatim")
    why: str = Field("", description="what this line shows")


class ConditionCheck(BaseModel):
    """A condition from the code or the playbook checked against this deployment."""

    condition: str = Field(description="e.g. 'topk > 2'")
    fact: str = Field(description="e.g. 'num_experts_per_tok = 8'")
    outcome: Literal["pass", "fail", "unknown"]


class FlagVerdict(BaseModel):
    """Does this flag do anything on this deployment, and what should a trial expect?

    `decided_by` says where the verdict comes from: `code` (the SGLang source of the running
    version: readers, guards, exits), `playbook` (a playbook rule alone, no code evidence either
    way), `model` (the researching model's own reading, which the code did not confirm) or
    `unknown`. optagent checks the claims (`agent.policy.claims`): only the code's analysis in
    this session can make a verdict `code`, and `checked` says what the check changed.
    `certainty` (0..1) is how sure that source is: for the code, how often the rule
    that decided it has been right on the taught labels (`tools.research.verdict.calibration`), at most 0.6
    when a guard or value research could not settle is left open; ~0.5 for a playbook rule alone
    (no labels score the playbook); ~0.3 or less for `unknown`. Trial
    ordering tries uncertain verdicts last; an uncertain rejection never rules a flag out.
    """

    flag: str = Field(description="the flag, with leading dashes")
    verdict: Verdict
    summary: str = Field(description="one or two sentences: the conclusion and why")
    evidence: list[Evidence] = Field(default_factory=list)
    conditions: list[ConditionCheck] = Field(default_factory=list)
    expected_effect: str = ""
    risk: str = ""
    lossy: bool = False
    suggested_value: str | None = Field(None, description="the value to try, if the flag takes one")
    decided_by: Literal["code", "playbook", "model", "unknown"] = Field(
        "unknown", description="code: from the SGLang source; playbook: a playbook rule alone"
    )
    certainty: float = Field(0.5, ge=0.0, le=1.0, description="0..1, how sure the deciding source is")
    checked: list[str] = Field(
        default_factory=list,
        description="set by optagent, not by the researcher: what checking the claims changed",
    )

    @field_validator("verdict", mode="before")
    @classmethod
    def _old_names(cls, value: Any) -> Any:
        """Older transcripts and models say `incompatible` or `live`."""
        return _OLD_NAMES.get(value, value) if isinstance(value, str) else value

    @property
    def rejected(self) -> bool:
        """True when research says a trial would be wasted (no-op, dead, refuses-to-start or
        incompatible-with-version) and is sure of it (see `final_rejection`)."""
        return final_rejection(self.model_dump())


def final_rejection(v: Mapping[str, Any] | None) -> bool:
    """A rejecting verdict that rules the flag out. One the code reached at certainty <= 0.6 (it
    rests on a guard or value research could not settle) is not final: the flag stays a candidate,
    tried after the sure ones (`doubtful_rejection`)."""
    if v is None:
        return False
    verdict = _OLD_NAMES.get(v.get("verdict"), v.get("verdict"))
    return verdict in REJECTED and not doubtful_rejection(v)


def doubtful_rejection(v: Mapping[str, Any] | None) -> bool:
    """A code verdict of no-op, dead or refuses-to-start at certainty <= 0.6."""
    if v is None or v.get("verdict") not in REJECTED or v.get("verdict") == "incompatible-with-version":
        return False
    certainty = v.get("certainty")
    return v.get("decided_by") == "code" and isinstance(certainty, int | float) and certainty <= DOUBT
