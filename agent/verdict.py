"""`FlagVerdict`: the researcher's structured answer about one flag, with `path:line` evidence."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Verdict = Literal["applies", "no-op", "dead", "incompatible", "unknown"]
REJECTED: frozenset[str] = frozenset({"no-op", "dead", "incompatible"})


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
    """Does this flag do anything on this deployment, and what should a trial expect?"""

    flag: str = Field(description="the flag, with leading dashes")
    verdict: Verdict
    summary: str = Field(description="one or two sentences: the conclusion and why")
    evidence: list[Evidence] = Field(default_factory=list)
    conditions: list[ConditionCheck] = Field(default_factory=list)
    expected_effect: str = ""
    risk: str = ""
    lossy: bool = False
    suggested_value: str | None = Field(None, description="the value to try, if the flag takes one")

    @property
    def rejected(self) -> bool:
        """True when research says a trial would be wasted (no-op, dead or incompatible)."""
        return self.verdict in REJECTED
