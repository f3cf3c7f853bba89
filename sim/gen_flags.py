"""Regenerate `sim/flags-<version>.json`: SGLang's real launch_server argparse catalog (dev-only).

Usage: PYTHONPATH=<dir with msgspec> python sim/gen_flags.py <unpacked wheel root> <version> <out.json>
e.g.   python sim/gen_flags.py /tmp/sgl/0.5.23 0.5.23 sim/flags-0.5.23.json

It imports the real `sglang.srt.server_args` with its heavy runtime modules stubbed out (they are only
used after parsing) and dumps every option of `ServerArgs.add_cli_args`. Needs `msgspec` on the path.
"""

import argparse
import ast
import json
import sys
import types
from unittest import mock

ROOT = sys.argv[1]


def pkg(name, path=None):
    m = types.ModuleType(name)
    m.__path__ = [path] if path else []
    sys.modules[name] = m
    return m


pkg("sglang", f"{ROOT}/sglang")
pkg("sglang.srt", f"{ROOT}/sglang/srt")
pkg("sglang.srt.utils", f"{ROOT}/sglang/srt/utils")
pkg("sglang.kernels", f"{ROOT}/sglang/kernels")
pkg("sglang.kernels.ops", f"{ROOT}/sglang/kernels/ops")
pkg("sglang.kernels.ops.kv_canary", f"{ROOT}/sglang/kernels/ops/kv_canary")
# utils.common: pull only the few pure helpers the field declarations use
with open(f"{ROOT}/sglang/srt/utils/common.py") as fh:
    src = fh.read()
tree = ast.parse(src)
want = {
    "nullable_str",
    "human_readable_int",
    "json_list_type",
    "LORA_TARGET_ALL_MODULES",
    "SUPPORTED_LORA_TARGET_MODULES",
}
body = [
    n
    for n in tree.body
    if (isinstance(n, ast.FunctionDef) and n.name in want)
    or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in want for t in n.targets))
]
common = types.ModuleType("sglang.srt.utils.common")
exec(
    "import re, json, argparse\nimport json as orjson\n"
    + ast.unparse(ast.Module(body=body, type_ignores=[])),
    common.__dict__,
)
sys.modules["sglang.srt.utils.common"] = common
for name in [
    "sglang.srt.environ",
    "sglang.srt.hardware_backend",
    "sglang.srt.hardware_backend.mlx",
    "sglang.srt.hardware_backend.mlx.runtime",
    "sglang.srt.hardware_backend.mps",
    "sglang.srt.hardware_backend.mps.runtime",
    "sglang.srt.runtime_context",
    "sglang.srt.speculative",
    "sglang.srt.speculative.decoupled_spec_io",
    "sglang.srt.utils.network",
    "sglang.srt.arg_groups.overrides",
    "sglang.srt.arg_groups.model_override_base",
    "sglang.srt.arg_groups.validation_hook",
    "sglang.srt.lora",
    "sglang.srt.lora.lora_registry",
]:
    sys.modules[name] = mock.MagicMock(name=name)
sys.modules["sglang.srt.environ"].envs.SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE.get.return_value = False
from sglang.srt.server_args import ServerArgs  # noqa: E402

p = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(p)
print(len(p._actions), file=sys.stderr)


def _plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return repr(v)


out = []
for a in p._actions:
    if not a.option_strings or a.dest == "help":
        continue
    t = a.type
    tname = None if t is None else getattr(t, "__name__", repr(t))
    kind = type(a).__name__
    out.append(
        {
            "names": a.option_strings,
            "dest": a.dest,
            "action": kind,
            "type": tname,
            "choices": None
            if a.choices is None
            else sorted(_plain(list(a.choices)), key=str)
            if isinstance(a.choices, set)
            else _plain(list(a.choices)),
            "nargs": a.nargs,
            "default": _plain(a.default),
            "const": _plain(a.const),
            "required": a.required,
            "help": a.help or "",
        }
    )
with open(sys.argv[3], "w") as fh:
    json.dump({"version": sys.argv[2], "prog": "sglang serve", "flags": out}, fh, indent=0)
