"""One resolution in the resolver worker (`child.run_request`): what `sglang.launch_server` does
with a command line up to the resolved record, what its parser alone stores, SGLang's own
ModelConfig facts, and the JSON rendering of the values."""

from __future__ import annotations

import dataclasses
import enum
import os
import types
from typing import Any

from . import standins


def resolve_argv(server_args_mod: types.ModuleType, argv: list[str]) -> dict[str, Any]:
    """What `sglang.launch_server` does with argv up to the resolved record."""
    server_args = server_args_mod.prepare_server_args(argv)
    if hasattr(server_args, "resolve_once"):  # >= 0.5.2x: resolution is explicit
        if (
            getattr(server_args, "smg_grpc_mode", False) or getattr(server_args, "grpc_mode", False)
        ) and server_args.tokenizer_path is None:
            server_args.tokenizer_path = server_args.model_path  # as run_server does
        server_args.resolve_once()
    if hasattr(server_args, "resolved_dict"):
        values = server_args.resolved_dict()
    else:
        values = {f.name: getattr(server_args, f.name) for f in dataclasses.fields(server_args)}
    out = {key: to_json(value) for key, value in values.items()}
    out[MODEL_CONFIG_KEY] = model_config_facts(server_args)
    return out


MODEL_CONFIG_KEY = "__model_config__"
PARSED_KEY = "__parsed__"


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
    the model runner decides from: `is_hybrid_swa`, `attention_arch`, `quantization`, ...), or {}
    when it cannot be built here."""
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
