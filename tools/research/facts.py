"""The facts a flag is researched against: the deployment's own (given), SGLang's start-up
resolution of its command line, SGLang's ModelConfig for its model, the flags' declared defaults,
and what the version's code and requirements say (its enums, the packages every server installs).
Given facts win over resolved ones, resolved over declared."""

from __future__ import annotations

import re
from typing import Any

from tools.research.catalog import FlagInfo
from tools.research.flag_index.lookup import FlagIndex
from tools.research.guards.terms import CODE_COMPUTED, CODE_ENUMS, MODEL_ATTRS, MODEL_ENUMS
from tools.research.startup.check import ENUM_MEMBERS, StartupAnswer


def deployment_facts(
    index: FlagIndex, given: dict[str, Any], startup: StartupAnswer | None, declared: dict[str, Any]
) -> dict[str, Any]:
    """Every fact guards are evaluated against, for one deployment and version (`declared`: the
    catalog's defaults, `default_facts`, computed once by the caller)."""
    resolved = {f"server.{k}": v for k, v in (startup.baseline if startup else {}).items() if _scalar(v)}
    code = {
        CODE_ENUMS: index.enums,
        CODE_COMPUTED: index.computed,
        MODEL_ATTRS: index.config_attrs,
        **installed(index, given),
    }
    return {**declared, **resolved, **model_config_facts(index, startup), **code, **given}


def default_facts(catalog: list[FlagInfo]) -> dict[str, Any]:
    """`server.<dest>` = the declared default of every flag with a literal, non-None default: a flag
    the deployment does not set has that value (given facts, e.g. resolved server args, win). A None
    default usually means "resolved later" (grammar_backend -> xgrammar), so it stays unknown."""
    out: dict[str, Any] = {}
    for f in catalog:
        d = f.default
        if isinstance(d, bool | int | float) or (isinstance(d, str) and re.fullmatch(r"[\w.:/-]*", d)):
            out[f"server.{f.dest}"] = d
    return out


def installed(index: FlagIndex, facts: dict[str, Any]) -> dict[str, Any]:
    """`software.flashinfer` where the version's server requirements install it on this GPU (a
    requirement of the wheel, or of its `srt` extra, on an NVIDIA GPU), and `software.cuda`, the
    CUDA of the torch the wheel pins; a given fact wins."""
    nvidia = facts.get("gpu.vendor", "nvidia" if facts.get("gpu.sm") is not None else None) == "nvidia"
    out: dict[str, Any] = {}
    if nvidia and any(r.startswith("flashinfer") for r in index.requires):
        out["software.flashinfer"] = True
    if nvidia and index.cuda:
        out["software.cuda"] = index.cuda  # the pinned torch's CUDA
    return out


def model_config_facts(index: FlagIndex, startup: StartupAnswer | None) -> dict[str, Any]:
    """SGLang's own ModelConfig for this deployment as facts (`model_config.is_hybrid_swa`), with
    the enum members its attributes compare against and the `self.<attr>` copies of it in the tree
    (`tools.research.guard_eval`); empty when the start-up check did not build it."""
    model = dict(startup.model) if startup is not None else {}
    if not model:
        return {}
    members = model.pop(ENUM_MEMBERS, [])
    facts = {f"model_config.{k}": tuple(v) if isinstance(v, list) else v for k, v in model.items()}
    facts[MODEL_ENUMS] = frozenset(members)
    facts[MODEL_ATTRS] = index.config_attrs
    return facts


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)
