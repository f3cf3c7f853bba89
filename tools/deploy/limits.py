"""What bounds the restarts optagent causes on a target: a rate per minute, a budget per day, and a
stop after consecutive failed candidates. Counted in the journal's `counters.json`; checked before a
deploy (a rollback is never refused)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tools.deploy.journal import DAY_S, Journal
from tools.deploy.outcome import DeployError

if TYPE_CHECKING:
    from tools.config import TargetConfig

__all__ = ["FAILURE_WINDOW_S", "check_limits", "restart_wait"]

FAILURE_WINDOW_S = 900.0
"""Consecutive failed candidates older than this no longer block new deploys."""


def restart_wait(journal: Journal, target: TargetConfig) -> float:
    """Seconds until a deploy is within the restart rate limit (0: now)."""
    now, most = time.time(), target.max_restarts_per_minute
    recent = sorted((x for x in journal.counters()["restarts"] if now - x < 60), reverse=True)
    return 0.0 if len(recent) < most else 60 - (now - recent[most - 1])


def check_limits(journal: Journal, target: TargetConfig) -> None:
    """`DeployError` when a deploy now would exceed a limit, saying which and when it is possible."""
    counters, now, t = journal.counters(), time.time(), target
    recent = [x for x in counters["restarts"] if now - x < 60]
    if len(recent) >= t.max_restarts_per_minute:
        raise DeployError(
            f"restart rate limit: {len(recent)} restarts in the last minute (max {t.max_restarts_per_minute}); "
            f"try again in {restart_wait(journal, t):.0f}s"
        )
    day = sorted(x for x in counters["restarts"] if now - x < DAY_S)
    damaged = [x for x in counters["damaged"] if now - x < DAY_S]
    if damaged:  # how many restarts the damaged file held is not known: never count them as none
        again = DAY_S - (now - max(damaged))
        raise DeployError(
            f"the restart counters of this target ({journal.counters_path}) were found damaged "
            f"{(now - max(damaged)) / 60:.0f} min ago and set aside as counters.unreadable-*.json beside "
            "them: how many restarts it had in the last 24 hours is not known, so the daily restart "
            f"budget (max_restarts_per_day = {t.max_restarts_per_day}) counts as spent for "
            f"{again / 3600:.1f} h more. If you know it had few, delete {journal.counters_path} to count "
            "from zero. Nothing was changed"
        )
    if len(day) >= t.max_restarts_per_day:
        again = DAY_S - (now - day[len(day) - t.max_restarts_per_day])
        raise DeployError(
            f"daily restart budget spent: {len(day)} restarts of this target in the last 24 hours "
            f"(max_restarts_per_day = {t.max_restarts_per_day} in [target]); the next deploy is possible "
            f"in {again / 3600:.1f} h. Nothing was changed"
        )
    failures = [x for x in counters["failures"] if now - x < FAILURE_WINDOW_S]
    if len(failures) >= t.max_consecutive_failures:
        raise DeployError(
            f"stopped after {len(failures)} consecutive failed candidates (max {t.max_consecutive_failures}); "
            f"check the host, or wait {FAILURE_WINDOW_S / 60:.0f} minutes"
        )
