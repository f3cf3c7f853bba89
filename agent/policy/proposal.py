"""Checks on a change a model proposes, before any restart: the same as `optagent deploy --set`.

The ranges SGLang accepts and the catalog of the running version (name, type, choices:
`tools.deploy.flagcheck.refusals`, the one check deploy and research use), then what no
flag value needs (shell metacharacters, control characters) and what the unit file can hold. A
refusal names the reason and, where one is close, the flag or value the model may have meant.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.context import DeploymentContext
    from agent.trial.record import TrialChange

_METACHARS = re.compile(r"[;&|`$<>\\\n\r\t\x00-\x1f]|\$\(")
"""Characters no SGLang flag value needs and a shell would act on; refused in a model's proposal
even where the unit file would quote them (a value made of them is a mistake or an attack)."""


def check_changes(
    ctx: DeploymentContext, changes: list[TrialChange], *, base_text: str | None = None
) -> list[str]:
    """One message per change the running version would refuse or optagent will not deploy.

    `ctx` is the `DeploymentContext` (its `catalog` and `version`); `changes` are `TrialChange`s.
    An empty catalog (source unreadable) checks only the values and the unit file, as `optagent
    deploy` does. `base_text`, when given, is the unit file the changes must apply to.
    """
    from tools.deploy.flagcheck import refusals

    problems: list[str] = []
    edits = []
    for ch in changes:
        if ch.value is not None and _METACHARS.search(ch.value):
            problems.append(
                f"{ch.flag} value {ch.value!r} contains shell or control characters; "
                "a server flag value never needs them"
            )
            continue
        edits.append((ch.action, ch.flag, None if ch.action == "unset" else ch.value))
    catalog = [f for f in (getattr(ctx, "catalog", None) or {}).values() if hasattr(f, "aliases")]
    problems += refusals(catalog, edits, version=getattr(ctx, "version", None) or "?")
    if not problems and base_text is not None:
        from agent.trial.record import apply_changes

        try:
            apply_changes(base_text, changes)
        except ValueError as e:  # UnitFileError: a value the unit file cannot hold
            problems.append(str(e))
    return problems


def in_catalog(ctx: DeploymentContext, flag: str) -> bool | None:
    """Whether `flag` is a flag of the running version (None: no catalog to tell)."""
    catalog = getattr(ctx, "catalog", None) or {}
    if not catalog:
        return None
    if flag in catalog:
        return True
    from tools.research.catalog import find_flag

    return find_flag([f for f in catalog.values() if hasattr(f, "aliases")], flag) is not None
