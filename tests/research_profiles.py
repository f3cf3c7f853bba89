"""The labelled deployments (tests/data/research_profiles.toml) as the facts the agent would build
for them, and the labelled cases; shared by tests/test_research_labels.py and
benchmarks/bench_research.py."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from agent.context import DeploymentContext
from tools.research.target.modelcfg import load_model_config, model_facts

DATA = Path(__file__).parent / "data"
PROFILES: dict[str, dict[str, Any]] = tomllib.loads((DATA / "research_profiles.toml").read_text())
NONE = "<none>"
"""TOML has no null: a server argument the profile sets to None."""


class SealedError(RuntimeError):
    """A sealed label file asked for where only taught ones may be read."""


def is_sealed(name: str) -> bool:
    """Whether a label file is sealed (top-level `sealed = true`): scored once, at the end of an
    issue, for totals only; never taught from, never printed case by case."""
    return bool(tomllib.loads((DATA / name).read_text()).get("sealed"))


def taught_files() -> list[str]:
    """Every label file research may learn from: `research_labels*.toml` but the sealed ones."""
    names = sorted(p.name for p in DATA.glob("research_labels*.toml"))
    return [n for n in names if not is_sealed(n)]


def load_cases(name: str = "research_labels.toml", *, sealed_ok: bool = False) -> list[dict[str, Any]]:
    """The labelled cases of one file; a sealed file only with `sealed_ok` (its one scoring)."""
    data = tomllib.loads((DATA / name).read_text())
    if data.get("sealed") and not sealed_ok:
        raise SealedError(f"{name} is sealed: score it once for totals only (bench_research.py --sealed)")
    return data["case"]


def case_id(name: str, case: dict[str, Any]) -> str:
    """`research_labels.toml: 0.5.23 story --flag=value`: one taught case, as the calibration
    file (`tools/research/verdict/calibration.toml`) records it."""
    value = f"={case['value']}" if "value" in case else ""
    return f"{name}: {case['version']} {case['profile']} {case['flag']}{value}"


def profile_facts(name: str) -> dict[str, Any]:
    """The flat facts of a labelled deployment, as the agent builds them."""
    p = PROFILES[name]
    model = model_facts(load_model_config(DATA / "model-configs" / p["config"]))
    server = {k: None if v == NONE else v for k, v in p["server"].items()}
    # a live server reports the model it serves (not `--model-path dummy`): the hub id of the config
    server = {"model_path": p["config"].removesuffix("_config.json").replace("--", "/"), **server}
    gpu: dict[str, Any] = {"name": p.get("gpu_name", f"sm{p['sm']} GPU"), "sm": p["sm"]}
    if "memory_mib" in p:
        gpu["memory_mib"] = p["memory_mib"]
    hardware = {"gpus": [gpu] * p["count"]}
    return DeploymentContext(server_info=server, model=model, hardware=hardware).facts


def profile_argv(name: str) -> list[str]:
    """The launch arguments a profile sets (besides the model), as a command line."""
    from tools.research.startup.check import argv_of

    return argv_of({k: None if v == NONE else v for k, v in PROFILES[name]["server"].items()})


def _takes_value(tree: Any, flag: str) -> bool:
    """From the index's catalog (kept in memory), not a fresh catalog parse per case."""
    from tools.research.flags import find_flag
    from tools.research.index import load_index
    from tools.research.startup.check import takes_value

    return takes_value(find_flag(load_index(tree).catalog, flag))


def case_startup(tree: Any, case: dict[str, Any]) -> Any:
    """What SGLang's own argument resolution says of a labelled case (unknown for a profile without
    the GPU's memory and name)."""
    from tools.research.startup.check import flag_argv, startup_answer

    return startup_answer(
        tree,
        profile_facts(case["profile"]),
        flag_argv(case["flag"], case.get("value"), takes_value=_takes_value(tree, case["flag"])),
        base_argv=profile_argv(case["profile"]),
        model_config=DATA / "model-configs" / PROFILES[case["profile"]]["config"],
    )


def research_case(tree: Any, profile: str, flag: str, value: str | None = None) -> Any:
    """Research's verdict on a flag (and value) for a labelled deployment, as a label would be
    decided: the deployment's facts and SGLang's own start-up answer for it."""
    from tools.research.analysis import analyze_flag
    from tools.research.index import load_index

    case = {"profile": profile, "flag": flag, **({"value": value} if value is not None else {})}
    return analyze_flag(
        load_index(tree), flag, profile_facts(profile), value=value, startup=case_startup(tree, case)
    )
