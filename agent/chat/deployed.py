"""What is deployed now, as a chat says it: the flags of the host's unit file (read as `optagent
status` reads it), what changed since the chat started, whether that is the known-good on record,
and what changed since the session before this one started (a run that kept flags, most often: a
chat opened after it called its result "the configuration at start"). A change already deployed
is found here too, so that asking for it costs no baseline and no restart."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.flagname import flag_name

if TYPE_CHECKING:
    from agent.policy.planner import PlannerDeps
    from tools.deploy.deployment import Deployment

LOOK_BACK = 10
"""Earlier transcripts read for the session before this one (newest first)."""


def flag_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """`set --x`, `--x 32 -> 64`, `removed --y`: how `after` differs from `before`, in `after`'s order."""
    out = []
    for flag, value in after.items():
        if flag not in before:
            out.append(f"set {flag}" + ("" if value is None else f" {value}"))
        elif before[flag] != value:
            out.append(f"{flag} {_shown(before[flag])} -> {_shown(value)}")
    out += [f"removed {flag}" for flag in before if flag not in after]
    return out


def _shown(value: Any) -> str:
    return "(switch)" if value is None else str(value)


def already_deployed(flags: dict[str, Any], changes: list[Any]) -> list[str]:
    """The changes `flags` already holds (a switch that is set, the same value, a flag that is not
    there to remove), each described (`--enable-mixed-chunk`, `unset --x`)."""
    held = []
    for c in changes:
        flag, value, action = _get(c, "flag"), _get(c, "value"), _get(c, "action") or "set"
        flag = flag_name(str(flag))
        if action == "unset" and flag not in flags:
            held.append(f"unset {flag}")
        elif action != "unset" and flag in flags and _same(flags[flag], value):
            held.append(flag + ("" if value is None else f" {value}"))
    return held


def _get(change: Any, key: str) -> Any:
    return change.get(key) if isinstance(change, dict) else getattr(change, key, None)


def _same(deployed: Any, wanted: Any) -> bool:
    if deployed is None or wanted is None:
        return deployed is None and wanted is None
    if str(deployed) == str(wanted):
        return True
    try:
        return float(deployed) == float(wanted)
    except ValueError:
        return False


async def deployed_now(deps: PlannerDeps, changes: list[Any] | None = None) -> dict[str, Any]:
    """The deployed configuration now and what changed (see the module docstring); with `changes`,
    `already_deployed` lists those it already holds."""
    from tools.deploy.units.file import UnitFile
    from tools.redact import redact_flags

    runner = deps.runner
    if runner is None:  # a dry run deploys nothing: the unit file as the chat found it
        flags = redact_flags(dict(getattr(deps.ctx, "unit_flags", None) or {}))
        return {
            "dry_run": True,
            "flags": flags,
            "read_from": "the unit file as this chat found it (a dry run deploys nothing)",
            "already_deployed": already_deployed(flags, changes or []),
        }
    deployment = getattr(runner, "deployment", None)
    parse = getattr(deployment, "parse", None) or UnitFile.parse
    text, source = runner.deployed_text, "this chat's record of what it deployed"
    if deployment is not None:
        try:
            text, source = await deployment.remote_text(), f"the host's unit file {deployment.remote_unit}"
        except Exception as e:  # the host did not answer: what this chat deployed last
            source += f" (the host's unit file could not be read: {e})"
    flags = redact_flags(parse(text).command.flags)
    start = redact_flags(parse(runner.baseline.text).command.flags)
    state: dict[str, Any] = {
        "flags": flags,
        "read_from": source,
        "since_chat_start": flag_changes(start, flags),
        "known_good": _known_good(deployment, parse, text, flags),
        "previous_session": _previous_session(deps, flags),
    }
    if changes is not None:
        state["already_deployed"] = already_deployed(flags, changes)
    return state


def _known_good(
    deployment: Deployment | None, parse: Any, text: str, flags: dict[str, Any]
) -> dict[str, Any] | None:
    """The known-good on record in the state dir (what a rollback restores): whether it is what is
    deployed, when it was recorded, and how the deployed flags differ from it (a change in flight)."""
    from tools.redact import redact_flags

    journal = getattr(deployment, "journal", None)
    recorded = journal.known_good() if journal is not None else None
    if recorded is None:
        return None
    when = None
    with contextlib.suppress(OSError):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(Path(journal.known_good_path).stat().st_mtime))
    return {
        "is_deployed": recorded == text,
        "recorded_at": when,
        "changes": flag_changes(redact_flags(parse(recorded).command.flags), flags),
    }


def _previous_session(deps: PlannerDeps, flags: dict[str, Any]) -> dict[str, Any] | None:
    """The latest earlier session in the transcripts directory that read its deployment (a run or a
    chat): its id, kind and start, how the deployed flags differ from the ones it started from, and
    the trials it kept. None when there is none."""
    from agent.transcripts.load import list_transcripts, load_transcript
    from agent.trial.record import TrialRecord
    from tools.redact import redact_flags

    mine = getattr(getattr(getattr(deps, "ui", None), "transcript", None), "path", None)
    if mine is None:
        return None
    mine = Path(mine)
    for path in [p for p in reversed(list_transcripts(mine.parent)) if p != mine][:LOOK_BACK]:
        try:
            loaded = load_transcript(path)
        except Exception:  # an unreadable transcript says nothing about the deployment
            continue
        context = loaded.events_of("context")
        start = (context[0].get("data") or {}).get("unit_flags") if context else None
        if not isinstance(start, dict):
            continue
        kept = []
        for e in loaded.events_of("trial"):
            with contextlib.suppress(Exception):
                record = TrialRecord.model_validate(e.get("data"))
                if record.decision == "kept":
                    kept.append(record.headline())
        header = loaded.header or {}
        return {
            "id": loaded.id,
            "kind": header.get("kind") or "session",
            "started_at": str(header.get("started_at") or "")[:16].replace("T", " ") or None,
            "changes": flag_changes(redact_flags(start), flags),
            "kept": kept,
        }
    return None


def deployed_lines(state: dict[str, Any]) -> list[str]:
    """`deployed_now`'s answer in words: the flags, then what changed since when."""
    flags = state.get("flags") or {}
    shown = " ".join(k if v is None else f"{k} {v}" for k, v in flags.items()) or "(no flags)"
    lines = [f"deployed now ({state.get('read_from')}): {shown}"]
    if state.get("dry_run"):
        return lines
    lines.append(f"since this chat started: {'; '.join(state.get('since_chat_start') or []) or 'no change'}")
    previous = state.get("previous_session")
    if previous and (previous.get("changes") or previous.get("kept")):
        changed = "; ".join(previous["changes"]) or "no change"
        when = f" at {previous['started_at']}" if previous.get("started_at") else ""
        line = f"since the {previous['kind']} {previous['id']} started{when}: {changed}"
        if previous.get("kept"):
            line += f" (it kept {'; '.join(previous['kept'])})"
        lines.append(line)
    known = state.get("known_good")
    if known:
        at = f", recorded {known['recorded_at']}" if known.get("recorded_at") else ""
        lines.append(
            f"this is the known-good configuration on record{at}" if known["is_deployed"] else
            f"the known-good on record{at} differs (a change in flight?): {'; '.join(known['changes']) or 'its text only'}"
        )  # fmt: skip
    return lines
