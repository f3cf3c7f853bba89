"""The `launch_server` command line, parsed exactly as SGLang 0.5.23 parses it.

The option table (`flags-0.5.23.json`) is dumped from the real `ServerArgs.add_cli_args` by
`gen_flags.py`, so names, aliases, value types, choices and defaults are SGLang's own, and argparse
behaves the same way (exit status 2, "unrecognized arguments", "ambiguous option", abbreviations).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"
_CATALOG = Path(__file__).with_name(f"flags-{SGLANG_VERSION}.json")


def human_readable_int(value: str) -> int:
    """SGLang's integer parser: `8192`, `8k`, `25.6k`, `1Mi` (SI and IEC suffixes)."""
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(f"Decimals are not allowed with IEC suffixes: {value}")
            return int(number) * iec[suffix]
        return int(float(number) * si[suffix])
    return int(value)


def json_list_type(value: str) -> Any:
    """A JSON value given on the command line."""
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list."
        ) from e


def loads(value: str) -> Any:
    """`json.loads` under the name argparse reports in its error message."""
    return json.loads(value)


def nullable_str(value: str) -> str | None:
    """`None` and the empty string mean no value."""
    return None if not value or value == "None" else value


def parse_cuda_graph_backend_arg(value: str) -> str:
    """A CUDA graph backend name (checked against the choices by argparse)."""
    return value


def parse_cuda_graph_config_arg(value: str) -> Any:
    """A JSON CUDA graph config."""
    return json_list_type(value)


_TYPES: dict[str | None, Callable[[str], Any] | None] = {
    None: None,
    "str": str,
    "int": int,
    "float": float,
    "human_readable_int": human_readable_int,
    "json_list_type": json_list_type,
    "loads": loads,
    "nullable_str": nullable_str,
    "parse_cuda_graph_backend_arg": parse_cuda_graph_backend_arg,
    "parse_cuda_graph_config_arg": parse_cuda_graph_config_arg,
}


class _DeprecatedStoreTrue(argparse.Action):
    """Stores True and warns, like SGLang's `DeprecatedStoreTrueAction`."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.pop("nargs", None)
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[no-untyped-def]
        print(f"WARNING: The command line argument '{option_string}' is deprecated.", file=sys.stderr)
        setattr(namespace, self.dest, True)


@cache
def catalog() -> list[dict[str, Any]]:
    """Every `launch_server` option of SGLang 0.5.23 (names, dest, type, choices, default, help)."""
    return json.loads(_CATALOG.read_text())["flags"]


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with SGLang's options, prog and error behaviour."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    for spec in catalog():
        names, action = spec["names"], spec["action"]
        kwargs: dict[str, Any] = {"dest": spec["dest"], "help": spec["help"].replace("%", "%%")}
        if action == "_StoreTrueAction":
            parser.add_argument(*names, action="store_true", default=spec["default"], **kwargs)
        elif action == "BooleanOptionalAction":
            positive = [n for n in names if not n.startswith("--no-")]
            parser.add_argument(
                *positive, action=argparse.BooleanOptionalAction, default=spec["default"], **kwargs
            )
        elif action == "DeprecatedStoreTrueAction":
            parser.add_argument(*names, action=_DeprecatedStoreTrue, default=False, **kwargs)
        else:
            if spec["choices"] is not None:
                kwargs["choices"] = spec["choices"]
            if spec["nargs"] is not None:
                kwargs["nargs"] = spec["nargs"]
            type_fn = _TYPES.get(spec["type"], str)
            if type_fn is not None:
                kwargs["type"] = type_fn
            parser.add_argument(*names, default=spec["default"], required=spec["required"], **kwargs)
    return parser


def parse_launch_args(argv: list[str]) -> argparse.Namespace:
    """Parse `launch_server` arguments; exits with status 2 and argparse's message on bad input."""
    return build_parser().parse_args(argv)
