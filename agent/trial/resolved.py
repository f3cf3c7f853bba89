"""The server's *resolved* configuration, and the playbook candidates it makes pointless.

`/get_server_info` reports the arguments as given: a flag left at its default reads `None` at the
top level, while the value the server actually resolved sits in `internal_states`, or in a
resolved structure: SGLang 0.5.23 gives the CUDA graph batch limit it captured only as
`cuda_graph_config.decode.max_bs` (arg_groups/cuda_graph_hook.py folds `--cuda-graph-max-bs-decode`
into it; `cuda_graph_max_bs_decode` itself stays None). Planning on the unresolved `None` trialled
`--cuda-graph-max-bs-decode 64` on servers already capturing 256, so every reader here takes, per
argument: the catalog's default, overridden by a non-None top-level value, overridden by the
runtime value from `internal_states` or the resolved graph configuration.
"""

from __future__ import annotations

import re
from typing import Any

from tools.flagname import flag_dest

_SCALARS = (str, int, float, bool)
_ALIASES = {"cuda_graph_max_bs": ("cuda_graph_max_bs_decode",)}
"""Runtime keys that also resolve another argument left unset (SGLang derives the decode graph limit
from the captured batch size when `--cuda-graph-max-bs-decode` is not given)."""


def _states(info: dict[str, Any]) -> dict[str, Any]:
    states = info.get("internal_states")
    if isinstance(states, list):
        states = states[0] if states and isinstance(states[0], dict) else {}
    return states if isinstance(states, dict) else {}


def _captured_decode_bs(info: dict[str, Any]) -> int | None:
    """The decode graph batch limit of a resolved `cuda_graph_config`, or None (none, or disabled)."""
    for where in (info, _states(info)):
        config = where.get("cuda_graph_config")
        decode = config.get("decode") if isinstance(config, dict) else None
        if isinstance(decode, dict) and decode.get("backend") != "disabled":
            max_bs = decode.get("max_bs")
            if isinstance(max_bs, int) and not isinstance(max_bs, bool) and max_bs > 0:
                return max_bs
    return None


def resolved_args(server_info: dict[str, Any], catalog: dict[str, Any] | None = None) -> dict[str, Any]:
    """Argument name (underscores) -> the value the running server uses, as far as it is known."""
    args = server_info.get("server_args") or server_info
    out: dict[str, Any] = {}
    for flag, entry in (catalog or {}).items():
        default = getattr(entry, "default", None)
        if isinstance(default, _SCALARS):
            out[flag_dest(flag)] = default
    for k, v in args.items():
        if isinstance(v, _SCALARS):
            out[k] = v
        elif v is None and out.get(k) is None:
            # None as given and as defaulted: off for a truthiness test (no speculative algorithm),
            # unknown for any comparison (it may still be resolved later, see agent.policy.conditions)
            out[k] = None
    runtime = {**_states(server_info), **_states(args)}
    captured = _captured_decode_bs(args)
    if captured is not None and not isinstance(runtime.get("cuda_graph_max_bs"), int):
        runtime["cuda_graph_max_bs"] = captured
    for k, v in runtime.items():
        if not isinstance(v, _SCALARS):
            continue
        out[k] = v
        for alias in _ALIASES.get(k, ()):
            if args.get(alias) is None:
                out[alias] = v
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _raises(candidate: Any, key: str) -> bool:
    """The lever raises a limit: one of its needs reads `server.<key> < ...` or `flag.<key> < ...`."""
    pattern = re.compile(rf"\b(server|flag)\.{re.escape(key)}\s*<(?!=)")
    return any(pattern.search(str(c)) for c in getattr(candidate.lever, "needs", []))


def pointless_reason(candidate: Any, resolved: dict[str, Any]) -> str | None:
    """Why trialling `candidate` cannot change anything on a server running `resolved`, or None.

    Equal to the running value: nothing changes. Below (or at) the running value of a limit the
    lever raises: the server already allows more.
    """
    if candidate.action != "set" or candidate.value is None:
        return None
    key = flag_dest(candidate.flag)
    if key not in resolved or resolved[key] is None:
        return None
    running, wanted = resolved[key], candidate.value
    a, b = _number(running), _number(wanted)
    if (a is not None and b is not None and a == b) or str(running).lower() == str(wanted).lower():
        return f"the running server already resolves {candidate.flag} to {running!r}"
    if a is not None and b is not None and b < a and _raises(candidate, key):
        return f"the running server already resolves {candidate.flag} to {running!r}, above {wanted}"
    return None


def drop_pointless(candidates: list[Any], resolved: dict[str, Any]) -> list[Any]:
    """The candidates with every pointless one marked `already-set` (with the resolved value as note)."""
    out = []
    for c in candidates:
        # also the ones the playbook doubts: research may overrule the playbook, never the server
        why = pointless_reason(c, resolved) if c.status in ("candidate", "no-op", "incompatible") else None
        out.append(c.model_copy(update={"status": "already-set", "note": why}) if why else c)
    return out


def same_as_running(flag: str, value: str | None, resolved: dict[str, Any]) -> str | None:
    """Why setting `flag` to `value` changes nothing on the running server (equal values), or None."""
    key = flag_dest(flag)
    if value is None or resolved.get(key) is None:
        return None
    running = resolved[key]
    a, b = _number(running), _number(value)
    if (a is not None and b is not None and a == b) or str(running).lower() == str(value).lower():
        return f"the running server already resolves {flag} to {running!r}"
    return None
