"""One resolution in the resolver worker (`child.run_request`): what `sglang.launch_server` does
with a command line up to the resolved record, what its parser alone stores, SGLang's own
ModelConfig facts, and the JSON rendering of the values."""

from __future__ import annotations

import dataclasses
import enum
import os
import types
from collections.abc import Callable
from typing import Any

from . import standins


def resolve_argv(
    server_args_mod: types.ModuleType,
    argv: list[str],
    *,
    refused: Callable[[BaseException], bool],
) -> dict[str, Any]:
    """What `sglang.launch_server` does with argv up to the resolved record, then the record's own
    checks the launch runs before it starts anything (`launch_checks`): an exception of those that
    `refused(exc)` calls SGLang's refusal is raised, any other leaves the resolved record as it
    was, and `CHECKS_KEY` says why they did not run (None when they passed)."""
    server_args = server_args_mod.prepare_server_args(argv)
    if hasattr(server_args, "resolve_once"):  # >= 0.5.2x: resolution is explicit
        if (
            getattr(server_args, "smg_grpc_mode", False) or getattr(server_args, "grpc_mode", False)
        ) and server_args.tokenizer_path is None:
            server_args.tokenizer_path = server_args.model_path  # as run_server does
        server_args.resolve_once()
    values = _values(server_args)
    checks = launch_checks(server_args, refused)
    if checks is None:  # they may write the record (0.5.23 normalizes LoRA paths): what is published
        values = _values(server_args)
    out = {key: to_json(value) for key, value in values.items()}
    out[MODEL_CONFIG_KEY] = model_config_facts(server_args)
    out[CHECKS_KEY] = checks
    return out


def _values(server_args: Any) -> dict[str, Any]:
    if hasattr(server_args, "resolved_dict"):
        return server_args.resolved_dict()
    return {f.name: getattr(server_args, f.name) for f in dataclasses.fields(server_args)}


def launch_checks(server_args: Any, refused: Callable[[BaseException], bool]) -> str | None:
    """`check_server_args()`: every version's launch asserts on the resolved record before it
    spawns anything (entrypoints/engine.py: 0.5.23 :1165, 0.5.15.post1 :790, 0.5.9 :1026, 0.4.9
    :689), so a refusal there is a server that does not start (`--page-size 3` with chunks of
    4096). Raises what `refused` calls SGLang's own refusal; None when the checks passed (or the
    tree has none), else why they could not run here (they read the fakes: 0.5.9 asks torch for
    its cuDNN version)."""
    if not hasattr(server_args, "check_server_args"):
        return None  # nothing its launch would check
    try:
        server_args.check_server_args()
    except Exception as exc:  # noqa: BLE001 - classified: SGLang's refusal, or not run here
        if refused(exc):
            raise
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


MODEL_CONFIG_KEY = "__model_config__"
PARSED_KEY = "__parsed__"
CHECKS_KEY = "__checks__"


def parsed_argv(server_args_mod: types.ModuleType, argv: list[str]) -> dict[str, Any] | None:
    """What SGLang's own parser stores for argv, before any resolution: a flag whose action stores
    nothing (a deprecation notice) leaves it as it was. None when the parser cannot be rebuilt."""
    import argparse

    parser = argparse.ArgumentParser()
    try:
        server_args_mod.ServerArgs.add_cli_args(parser)
        namespace, _ = parser.parse_known_args(argv)
    except (Exception, SystemExit):  # noqa: BLE001 - the resolution itself already succeeded
        return None
    return {key: to_json(value) for key, value in vars(namespace).items()}


def model_config_facts(server_args: Any) -> dict[str, Any]:
    """The scalar attributes of SGLang's own ModelConfig for this model and these arguments (what
    the model runner decides from: `is_hybrid_swa`, `attention_arch`, `quantization`, `dtype` as
    `torch.bfloat16`, ...), or {} when it cannot be built here."""
    try:
        from sglang.srt.configs.model_config import ModelConfig

        config = ModelConfig.from_server_args(server_args)
    except Exception:  # noqa: BLE001 - model facts are extra: the resolution stands without them
        return {}
    facts: dict[str, Any] = {}
    members: set[str] = set()
    for name, value in vars(config).items():
        if name.startswith("_"):
            continue
        if isinstance(value, enum.Enum):  # `AttentionArch.MLA`, as the code compares it
            kind = type(value).__name__
            facts[name] = f"{kind}.{value.name}"
            members |= {f"{kind}.{m.name}" for m in type(value)}
        elif type(value).__name__ == "dtype" and type(value).__module__ == "torch":
            facts[name] = repr(value)  # `torch.bfloat16`: the dtype SGLang picked, not just one
        elif value is None or isinstance(value, (bool, int, float, str)):
            facts[name] = value
        elif isinstance(value, (list, tuple)) and all(
            v is None or isinstance(v, (bool, int, float, str)) for v in value
        ):
            facts[name] = list(value)
        elif not callable(value) and not isinstance(value, (list, tuple, dict, set)):
            facts[name] = f"<{type(value).__name__} object>"  # only that it is there is a fact
    facts[ENUM_MEMBERS] = sorted(members)
    return facts


ENUM_MEMBERS = "__enum_members__"


def to_json(value: Any) -> Any:
    """JSON-safe rendering of a resolved value (stand-ins become marked strings)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((to_json(v) for v in value), key=repr)
    if isinstance(value, (standins.StandIn, standins.StandInMeta)):
        return f"<stand-in {getattr(value, '__qualname__', type(value).__qualname__)}>"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    fields = getattr(type(value), "__struct_fields__", None)  # msgspec.Struct
    if fields is not None:
        return {name: to_json(getattr(value, name)) for name in fields}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return repr(value)
