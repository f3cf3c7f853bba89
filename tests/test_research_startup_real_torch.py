"""The start-up check on fake hardware against the real SGLang 0.5.23 with the real torch 2.14.1.

The deployment is the real CPU one `optagent sim up --real` lays out (`sim/real/layout.py`), its
facts gathered as a run gathers them: the unit's flags and SGLang variables, the host's CPU read
through `tools.research.target.cpu` over a local transport (`agent.context.DeploymentContext`).
For its command line, and for the same line with each flag of `FLAGS`, SGLang's own start-up runs
twice: in the research worker (fake torch answering from the host's facts, isolated) and in the
real server's venv (`sim.real.environment`: real torch, SGLang's CPU kernels, this machine's CPU),
as `python -m sglang.launch_server` runs it up to the point where it starts anything:
`load_plugins()`, `prepare_server_args(argv)` (launch_server.py:79-81), `resolve_once()` (:17-29) and
`check_server_args()` (entrypoints/engine.py:1153-1165). No server is launched for that; one
real launch shows that a refusal of those checks is the launch's own.

Both seed `random` with 0 before they resolve (the worker does, `worker/child.py`), so a value
SGLang draws at random (`random_seed`) compares too.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.sim import free_port

pytestmark = pytest.mark.slow(seconds=240)

STARTUP = Path(__file__).resolve().parent.parent / "tools" / "research" / "startup"
MODEL_KEY, PARSED_KEY, ENUMS = "__model_config__", "__parsed__", "__enum_members__"

# Resolved arguments that legitimately differ between the worker and the real SGLang here:
DIFFERENT = {
    # the worker is served its own copy of the model's config.json (`Resolver._model_dir`: one
    # directory per content under the cache, the only model files its sandbox can read); the
    # real SGLang resolves the real model directory. Equal when both resolve the same directory
    # (test_on_the_same_model_directory_nothing_differs).
    "model_path", "tokenizer_path", "served_model_name",
}  # fmt: skip
# ... and attributes of SGLang's own ModelConfig:
MODEL_DIFFERENT = {
    "model_path",  # as above
    # ModelConfig reads generation_config.json beside config.json (configs/model_config.py); the
    # worker's copy of the model is config.json alone, so it has none (None, the real one has a
    # GenerationConfig). No start-up decision reads it; sampling defaults at request time do.
    "hf_generation_config",
}
# ... and what the parser alone stored: the --model-path given.
PARSED_DIFFERENT = {"model_path"}

FLAGS: dict[str, list[str]] = {
    "max-running-requests 8": ["--max-running-requests", "8"],
    "chunked-prefill-size 8192": ["--chunked-prefill-size", "8192"],
    "schedule-policy lpm": ["--schedule-policy", "lpm"],
    "stream-interval 8": ["--stream-interval", "8"],
    "enable-torch-compile": ["--enable-torch-compile"],
    "enable-mixed-chunk": ["--enable-mixed-chunk"],
    "mem-fraction-static 0.9": ["--mem-fraction-static", "0.9"],
    "attention-backend intel_amx": ["--attention-backend", "intel_amx"],
    "tp-size 2": ["--tp-size", "2"],
    "max-running-requests 0": ["--max-running-requests", "0"],
    "schedule-policy invalid": ["--schedule-policy", "no_such_policy"],
    "page-size 3": ["--page-size", "3"],
    "torch-compile without padding": ["--enable-torch-compile", "--disable-cuda-graph-padding"],
    "schedule-conservativeness -1": ["--schedule-conservativeness", "-1"],
    "dtype float16": ["--dtype", "float16"],
    "disable-radix-cache": ["--disable-radix-cache"],
    "speculative ngram": ["--speculative-algorithm", "NGRAM"],
}

# SGLang's own start-up in the real venv, as launch_server runs it up to starting anything; one
# forked child per command line (as the worker does), each answer rendered as the worker renders
# it (`worker/resolution.py`: to_json, model_config_facts, parsed_argv), a failure as the
# worker's classification words it (`worker/errors.py`).
REAL_STARTUP = r"""
import contextlib, io, json, os, random, sys, traceback
sys.path.insert(0, sys.argv[1])
from worker.resolution import model_config_facts, parsed_argv, to_json
import sglang
from sglang.srt.plugins import load_plugins
import sglang.srt.server_args as server_args_mod

load_plugins()
tree = os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__))) + os.sep


def resolve(argv):
    err = io.StringIO()
    random.seed(0)
    try:
        with contextlib.redirect_stderr(err):
            sa = server_args_mod.prepare_server_args(argv)
            if (sa.smg_grpc_mode or sa.grpc_mode) and sa.tokenizer_path is None:
                sa.tokenizer_path = sa.model_path
            sa.resolve_once()
            sa.check_server_args()
            args = {k: to_json(v) for k, v in sa.resolved_dict().items()}
            args["__model_config__"] = model_config_facts(sa)
        args["__parsed__"] = parsed_argv(server_args_mod, argv)
        return {"ok": True, "args": args}
    except BaseException as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(tree)]
        where = f"{os.path.relpath(frames[-1].filename, tree)}:{frames[-1].lineno}" if frames else None
        if isinstance(exc, SystemExit):
            text = err.getvalue().strip()
            message = text.splitlines()[-1] if text else f"exit {exc.code}"
            return {"ok": False, "error": f"SystemExit: {message}", "where": where}
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "where": where,
                "trace": traceback.format_exc()[-3000:]}


answers = []
for argv in json.loads(sys.stdin.read()):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        with os.fdopen(write, "w") as out:
            out.write(json.dumps(resolve(argv)))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as inp:
        answers.append(json.loads(inp.read()))
    os.waitpid(pid, 0)
with open(sys.argv[2], "w") as f:
    json.dump(answers, f)
"""


def real_environment(home: Path) -> dict[str, str]:
    """What the real deployment's process runs with: the unit's variables (`layout.ENVIRONMENT`:
    the CPU engine, Hugging Face offline), a private HOME."""
    from sim.real.layout import ENVIRONMENT

    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(home), **ENVIRONMENT}


def real_startup(env: Any, argvs: list[list[str]], scratch: Path) -> list[dict[str, Any]]:
    """SGLang's own start-up of each command line in the real venv (`REAL_STARTUP`)."""
    script, out = scratch / "real_startup.py", scratch / "answers.json"
    script.write_text(REAL_STARTUP)
    done = subprocess.run(
        [str(env.python), str(script), str(STARTUP), str(out)],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        env=real_environment(scratch),
        cwd=scratch,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0 and out.is_file(), done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def deployment(real_env, sglang_0523):  # type: ignore[no-untyped-def]
    """The real CPU deployment's context as a run gathers it, without its server: the unit as
    `optagent sim up --real` writes it, the host's CPU facts over a local transport."""
    from agent.context import SGLANG_ENV, DeploymentContext
    from sim.real.layout import render_unit
    from tools.deploy.remote import LocalTransport
    from tools.deploy.units.file import UnitFile
    from tools.research.target.cpu import read_cpu
    from tools.research.target.hardware import HardwareFacts

    unit = UnitFile.parse(render_unit(real_env, port=free_port()))
    cpu = asyncio.run(read_cpu(LocalTransport()))
    assert cpu.unknown == {}, cpu.unknown
    return DeploymentContext(
        unit_flags=unit.command.flags,
        hardware=HardwareFacts(gpus=[], interconnect="none", driver=None),
        cpu=cpu,
        unit_env={k: v for k, v in unit.environment.items() if k.startswith(SGLANG_ENV)},
        tree=sglang_0523,
        model_config=json.loads((real_env.model_dir / "config.json").read_text()),
    )


def base_argv(ctx: Any) -> list[str]:
    from tools.research.startup.check import argv_of, unit_settings

    return argv_of(unit_settings(ctx.unit_flags))


def line_with(ctx: Any, flag: list[str]) -> list[str]:
    """The deployment's line with `flag` in place of its own setting of it (as `startup_answer`)."""
    from tools.research.startup.check import without

    base = base_argv(ctx)
    return [*without(base, flag[0]), *flag] if flag else base


@pytest.fixture(scope="module")
def answers(deployment, real_env, tmp_path_factory):  # type: ignore[no-untyped-def]
    """name -> (the worker's answer, the real SGLang's) for the deployment's line ("base") and
    for it with each flag of `FLAGS`; "same dir": the real one on the worker's own model copy."""
    from tools.research.startup.check import environment_of, hardware_of, resolver_for

    facts = deployment.facts
    lines = {"base": line_with(deployment, []), **{k: line_with(deployment, f) for k, f in FLAGS.items()}}
    resolver = resolver_for(deployment.tree, hardware_of(facts), environment_of(facts))
    fake = {k: resolver.resolve(argv, deployment.model_config_file()) for k, argv in lines.items()}
    copy = fake["base"]["args"]["model_path"]  # the worker's own copy of the model's config.json
    argvs = [["--model-path", str(real_env.model_dir), *argv] for argv in lines.values()]
    argvs.append(["--model-path", copy, *lines["base"]])
    real = real_startup(real_env, argvs, tmp_path_factory.mktemp("real-startup"))
    out = {k: (fake[k], real[i]) for i, k in enumerate(lines)}
    out["same dir"] = (fake["base"], real[-1])
    return out


def differences(fake: dict[str, Any], real: dict[str, Any], skip: set[str]) -> dict[str, tuple[Any, Any]]:
    """Key -> (worker's, real) where the two records differ, but for `skip`."""
    missing = object()
    return {
        k: (fake.get(k, missing), real.get(k, missing))
        for k in sorted(set(fake) | set(real))
        if k not in skip and fake.get(k, missing) != real.get(k, missing)
    }


@pytest.mark.parametrize("name", ["base", *FLAGS])
def test_the_worker_resolves_as_the_real_sglang_does(answers, name: str) -> None:  # type: ignore[no-untyped-def]
    """Field by field: the resolved arguments, SGLang's ModelConfig and what the parser stored;
    or the same refusal: SGLang's message, and the same `file:line`."""
    fake, real = answers[name]
    if not real["ok"]:
        assert fake["ok"] is False and fake["kind"] == "refused", (fake, real.get("trace"))
        assert (fake["error"], fake["where"]) == (real["error"], real["where"])
        return
    assert fake["ok"] is True and fake["checks"] is None, (fake, real)  # the launch's checks ran, and passed
    args, real_args = dict(fake["args"]), dict(real["args"])
    model, real_model = args.pop(MODEL_KEY), real_args.pop(MODEL_KEY)
    parsed, real_parsed = args.pop(PARSED_KEY), real_args.pop(PARSED_KEY)
    assert len(args) > 300 and model and parsed  # a whole record on each side, not an empty one
    assert differences(args, real_args, DIFFERENT) == {}
    assert differences(model, real_model, MODEL_DIFFERENT) == {}
    assert differences(parsed, real_parsed, PARSED_DIFFERENT) == {}
    listed = {k for k in DIFFERENT if args[k] != real_args[k]} | {
        f"model.{k}" for k in MODEL_DIFFERENT if model[k] != real_model[k]
    }
    assert listed == DIFFERENT | {f"model.{k}" for k in MODEL_DIFFERENT}  # each listed one does differ


def test_on_the_same_model_directory_nothing_differs(answers) -> None:  # type: ignore[no-untyped-def]
    """The real SGLang on the worker's own copy of config.json: every listed difference goes (the
    paths, and no generation config beside the config.json)."""
    fake, real = answers["same dir"]
    assert fake["ok"] and real["ok"], real
    assert differences(fake["args"], real["args"], set()) == {}
    assert real["args"][MODEL_KEY]["hf_generation_config"] is None


def test_what_this_host_decides_is_decided_alike(answers, deployment) -> None:  # type: ignore[no-untyped-def]
    """Sizes SGLang picks from the host (memory_hook.py:78-230) and the AMX fallback
    (overrides.py:1300-1310) are this machine's, and not left at their defaults."""
    base = answers["base"][1]["args"]
    assert base["chunked_prefill_size"] in (2048, 4096, 8192, 16384) and base["random_seed"] is not None
    amx = answers["attention-backend intel_amx"]
    want = "intel_amx" if deployment.cpu.amx else "torch_native"
    assert amx[0]["args"]["attention_backend"] == amx[1]["args"]["attention_backend"] == want
    dtypes = {k: (answers[k][0]["args"][MODEL_KEY]["dtype"], answers[k][1]["args"][MODEL_KEY]["dtype"])
              for k in ("base", "dtype float16")}  # fmt: skip
    assert dtypes == {"base": ("torch.bfloat16",) * 2, "dtype float16": ("torch.float16",) * 2}
    # no start-up check refuses a batch cap of 0 (a real server starts with it: past start-up, its
    # KV pool reads 0 as no cap, model_runner_components/kv_pool_runtime.py:80)
    zero = answers["max-running-requests 0"]
    assert zero[0]["args"]["max_running_requests"] == zero[1]["args"]["max_running_requests"] == 0


@pytest.mark.parametrize(
    ("name", "message", "where"),
    [
        ("schedule-policy invalid", "argument --schedule-policy: invalid choice: 'no_such_policy'",
         "sglang/srt/server_args.py:696"),
        ("page-size 3", "AssertionError: chunked_prefill_size must be divisible by page_size",
         "sglang/srt/arg_groups/validation_hook.py:244"),
        ("torch-compile without padding", "AssertionError: --disable-cuda-graph-padding is incompatible",
         "sglang/srt/arg_groups/validation_hook.py:188"),
        ("schedule-conservativeness -1", "AssertionError: schedule_conservativeness must be non-negative",
         "sglang/srt/arg_groups/validation_hook.py:314"),
    ],
)  # fmt: skip
def test_a_refusal_is_the_real_ones(answers, name: str, message: str, where: str) -> None:  # type: ignore[no-untyped-def]
    fake, real = answers[name]
    assert real["ok"] is False and message in real["error"] and real["where"] == where, real
    assert fake["kind"] == "refused" and fake["error"] == real["error"] and fake["where"] == where


def real_changes(base: dict[str, Any], trial: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """What `check.startup_answer` reports as changed, computed from the real SGLang's records."""
    before, after = dict(base["args"]), dict(trial["args"])
    model, model_after = before.pop(MODEL_KEY), after.pop(MODEL_KEY)
    before.pop(PARSED_KEY), after.pop(PARSED_KEY)
    changed = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
    changed |= {
        f"model_config.{k}": (model.get(k), v)
        for k, v in model_after.items()
        if model.get(k) != v and k != ENUMS
    }
    return changed


@pytest.mark.parametrize("name", list(FLAGS))
def test_the_answer_research_reads_is_the_real_sglangs(answers, deployment, name: str) -> None:  # type: ignore[no-untyped-def]
    """`startup_answer` (what research and the planner read) says of each flag what the real
    SGLang's own records say: refused with its message, the same, or changed in these settings."""
    from tools.research.startup.check import startup_answer

    answer = startup_answer(
        deployment.tree,
        deployment.facts,
        FLAGS[name],
        base_argv=base_argv(deployment),
        model_config=deployment.model_config_file(),
    )
    base, trial = answers["base"][1], answers[name][1]
    assert "launch checks" not in answer.note  # they ran here
    if not trial["ok"]:
        assert (answer.kind, answer.message, answer.where) == ("refused", trial["error"], trial["where"])
        return
    changed = real_changes(base, trial)
    assert answer.kind == ("changed" if changed else "same"), (answer, changed)
    assert {k: tuple(v) for k, v in answer.changed.items()} == changed


def test_the_real_launch_refuses_as_the_worker_says(deployment, real_env, answers, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`python -m sglang.launch_server` with the deployment's unit and `--page-size 3`: the chunk
    size SGLang picked from this host's memory is no multiple of 3, and the launch stops at the
    assert the worker named, with its message, before it starts anything."""
    from sim.real.layout import render_unit
    from tools.deploy.units.file import UnitFile

    unit = UnitFile.parse(render_unit(real_env, port=free_port()))
    argv = [*unit.command.argv, "--page-size", "3"]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=real_environment(tmp_path),
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # it started after all: stop it and its children
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    fake = answers["page-size 3"][0]
    assert proc.returncode == 1, output[-3000:]
    assert output.rstrip().splitlines()[-1] == fake["error"], output[-3000:]
    frames = re.findall(r'File "[^"]*/site-packages/(sglang/[^"]+)", line (\d+)', output)
    assert frames and f"{frames[-1][0]}:{frames[-1][1]}" == fake["where"], output[-3000:]
    assert "entrypoints/engine.py" in {path.split("srt/", 1)[-1] for path, _ in frames}
