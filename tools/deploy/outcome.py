"""What a deploy reports and how it fails: shared by `deployment` (the gate) and `restore` below it."""

from __future__ import annotations

from dataclasses import dataclass, field

from tools.deploy.health import HealthResult


class DeployError(Exception):
    """A deploy could not be started or finished; the message says why and what state the host is in."""


class UnitInvalidError(DeployError):
    """A unit file optagent would have to record or start does not parse; nothing was changed."""


class DriftError(DeployError):
    """The unit file on the host is not the last deployed one; nothing was overwritten."""


@dataclass
class DeployOutcome:
    """What a deploy or rollback did."""

    ok: bool
    error: str = ""
    log_tail: str = ""
    seconds: float = 0.0
    diff: str = ""
    changed: bool = True
    """False when nothing had to change (same text, or nothing in flight to roll back)."""
    rolled_back: bool = False
    health: HealthResult | None = None
    timings: dict[str, float] = field(default_factory=dict)
    restored: bool = True
    """With `rolled_back`: whether known-good is serving again (False: ROLLBACK FAILED, check the host)."""
