"""What the agents know about the deployment: flags, version, server args, GPUs (or the CPU host of
SGLang's CPU engine), the unit's SGLang variables, model, catalog.

Every piece is gathered by a tool from `tools/`; a piece that cannot be read is recorded as missing
with the reason (conditions on it then evaluate to `unknown`, never to a guess).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.flagname import flag_dest, flag_name
from tools.research.startup.check import MODEL_FLAGS

_SCALARS = (str, int, float, bool, type(None))


@dataclass
class DeploymentContext:
    """The facts a planner and a researcher reason over."""

    unit_flags: dict[str, str | None] = field(default_factory=dict)
    server_info: dict[str, Any] = field(default_factory=dict)
    version: str | None = None
    model: Any = None
    hardware: Any = None
    cpu: Any = None
    """The host's CPU facts (`tools.research.target.cpu.CpuFacts`), read on a CPU deployment only."""
    unit_env: dict[str, str] = field(default_factory=dict)
    """The unit's SGLang variables (`Environment=` and `EnvironmentFile=`, `SGLANG_*`/`SGL_*`, none
    named like a secret): SGLang's own start-up runs with them."""
    tree: Any = None
    catalog: dict[str, Any] = field(default_factory=dict)
    model_config: dict[str, Any] | None = None
    """The model's config.json as read (SGLang's own start-up is run with it)."""
    max_concurrency: int = 64
    kv_tokens_needed: int | None = None
    """KV tokens the benchmark's highest level holds at once (concurrency x (input + output))."""
    prefix_share: float | None = None
    """Share of shared-prefix prompts a trial of a caching flag is measured on
    (`tools.bench.workload.prefix_share`)."""
    missing: dict[str, str] = field(default_factory=dict)
    """Piece name -> why it could not be read."""

    def fit_bench(self, bench: Any) -> Any:
        """`bench` with what the model decides about the load: random token ids inside its
        vocabulary (`config.json`'s `vocab_size`, or its text model's) unless the config sets one."""
        cfg = self.model_config or {}
        vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
        if bench.vocab_size is not None or not isinstance(vocab, int) or vocab < 2:
            return bench
        return bench.model_copy(update={"vocab_size": vocab})

    @property
    def facts(self) -> dict[str, Any]:
        """The flat fact mapping conditions are evaluated against (see agent/policy/playbook.toml)."""
        facts: dict[str, Any] = {"bench.max_concurrency": self.max_concurrency}
        if self.kv_tokens_needed:
            facts["bench.kv_tokens_needed"] = self.kv_tokens_needed
        if self.prefix_share is not None:
            facts["bench.prefix_share"] = self.prefix_share
        if self.version:
            facts["sglang.version"] = self.version
        # resolved values (catalog default < top level < internal_states); None where the server
        # left a value open (agent.policy.conditions: false for a truthiness test, unknown for a comparison)
        for k, v in self.resolved_args.items():
            facts[f"server.{k}"] = v
        for k, v in self.unit_flags.items():
            # a boolean flag (no value) that is present is True; an absent one is missing
            facts["flag." + flag_dest(k)] = True if v is None else _number(v)
        for k, v in _as_dict(self.model).items():
            if isinstance(v, _SCALARS) or (
                isinstance(v, list | tuple) and all(isinstance(x, str) for x in v)
            ):
                facts[f"model.{k}"] = list(v) if isinstance(v, tuple) else v
        kinds = facts.get("model.attention_kinds")
        if isinstance(kinds, list):
            facts["model.attention_kinds_has_linear"] = any("linear" in k for k in kinds)
        hw = _as_dict(self.hardware)
        gpus = hw.get("gpus") or []
        if self.hardware is not None and not gpus:  # read, and none there (SGLang's CPU engine)
            facts["gpu.count"] = 0
        if gpus:
            first = _as_dict(gpus[0])
            facts["gpu.count"] = len(gpus)
            for k in ("name", "memory_mib", "compute_capability"):
                if k in first:
                    facts[f"gpu.{k}"] = first[k]
            if first.get("sm"):
                facts["gpu.sm"] = _number(str(first["sm"]).removeprefix("sm"))
        if hw.get("interconnect") is not None:
            facts["interconnect"] = str(hw["interconnect"]).lower()
        if self.cpu is not None:
            facts.update({f"cpu.{k}": v for k, v in self.cpu.known().items()})
        facts.update({f"env.{k}": v for k, v in self.unit_env.items()})
        return facts

    @property
    def resolved_args(self) -> dict[str, Any]:
        """Server argument -> the value the running server uses (see `agent.trial.resolved`)."""
        from agent.trial.resolved import resolved_args

        return resolved_args(self.server_info, self.catalog)

    def startup(self, flag: str, value: Any) -> Any:
        """What SGLang's own start-up says of `flag` (set to `value`) on this deployment: the unit
        file's command line resolved with and without it (`tools.research.startup.check`); None
        without a source tree or a model config."""
        config = self.model_config_file()
        if self.tree is None or config is None:
            return None
        from tools.research.startup.check import (
            argv_of,
            flag_argv,
            startup_answer,
            takes_value,
            unit_settings,
        )

        info = self.catalog.get(flag)
        argv = flag_argv(flag, value, takes_value=takes_value(info))
        return startup_answer(
            self.tree,
            self.facts,
            argv,
            base_argv=argv_of(unit_settings(self.unit_flags)),
            model_config=config,
        )

    def model_config_file(self) -> Path | None:
        """The model's config.json as read, in a file SGLang's own start-up can load (None: not read)."""
        if self.model_config is None:
            return None
        from tools.localfiles import write_bytes

        data = json.dumps(self.model_config, sort_keys=True).encode()
        config = Path(tempfile.gettempdir()) / f"optagent-model-{hashlib.sha256(data).hexdigest()[:16]}.json"
        write_bytes(config, data)  # each time: a file planted at that /tmp name is replaced, never read
        return config

    def summary(self) -> dict[str, Any]:
        """A JSON-able digest for prompts, the transcript and the report."""
        return {
            "sglang_version": self.version,
            "source": str(getattr(self.tree, "origin", "")) or None,
            "unit_flags": self.unit_flags,
            "model": _as_dict(self.model),
            "hardware": _as_dict(self.hardware),
            **({"cpu": _as_dict(self.cpu)} if self.cpu is not None else {}),
            **({"unit_env": self.unit_env} if self.unit_env else {}),
            "catalog_size": len(self.catalog),
            "missing": self.missing,
        }


def _number(value: Any) -> Any:
    """`"32"` -> 32, `"0.85"` -> 0.85; anything else unchanged (unit file values are text)."""
    if isinstance(value, str):
        for cast in (int, float):
            try:
                return cast(value)
            except ValueError:
                pass
    return value


def _as_dict(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return {k: v for k, v in vars(obj).items() if not k.startswith("_")}


async def gather_context(
    config: Any,
    transport: Any,
    *,
    on_step: Any = None,
    waiting: Any = None,
    index: bool = True,
    tree: Any = None,
    deadline: Any = None,
) -> DeploymentContext:
    """Read every piece of context for `config`'s target through `transport`. `waiting()` is a
    context manager yielding a progress callback (`RunUI.waiting`): a fetch of the source or a build
    of its code index (30 s to minutes, cold) is shown while it lasts. With `index`, the code index
    is loaded here (research needs it next) rather than inside the first research. `tree`: the
    source tree to read instead of the running version's (`optagent research --source/--version`).
    `deadline` (a run's `agent.trial.deadline.Deadline`): a first build of the code index or of the
    start-up check's venv starts only if the budget holds it, else `BudgetTooSmall` is raised.

    One piece because it reads the pieces in the order the progress shows them, each failure
    recorded in `ctx.missing` rather than raised, into the one context it returns.
    """
    from tools.bench.workload import prefix_share
    from tools.deploy.units.file import UnitFile

    b = config.bench
    ctx = DeploymentContext(
        max_concurrency=max(b.concurrency),
        kv_tokens_needed=max(b.concurrency) * (b.input_len + b.output_len),
        prefix_share=prefix_share(b),
    )
    say = on_step or (lambda text: None)
    try:
        ctx.unit_flags = dict(UnitFile.load(config.target.local_unit).command.flags)
    except Exception as e:
        ctx.missing["unit_flags"] = str(e)
    try:
        ctx.unit_env = await _unit_env(config, transport)
    except Exception as e:
        ctx.missing["unit_env"] = str(e)
    say("server info")
    try:
        from tools.deploy.health import get_server_info

        ctx.server_info = await _resolve(get_server_info(config.target.endpoint))
    except Exception as e:
        ctx.missing["server_info"] = str(e)
    ctx.version = config.research.version or ctx.server_info.get("version")
    say("model config")
    await _model(ctx, transport)
    say("GPUs")
    try:
        from tools.research.target.hardware import HardwareFacts, read_hardware

        if on_cpu(ctx):  # SGLang's CPU engine: no GPU to read, and no nvidia-smi to read it with
            from tools.research.target.cpu import read_cpu

            ctx.hardware = HardwareFacts(gpus=[], interconnect="none", driver=None)
            ctx.cpu = await read_cpu(transport)
            ctx.missing.update({f"cpu.{k}": why for k, why in ctx.cpu.unknown.items()})
        else:
            ctx.hardware = await _resolve(read_hardware(transport, nvidia_smi=config.target.nvidia_smi))
    except Exception as e:
        ctx.missing["hardware"] = str(e)
    say(f"SGLang {ctx.version or '?'} source and flag catalog")
    wait = waiting or (lambda: contextlib.nullcontext(say))
    with wait() as progress:
        await _source(ctx, config, progress, tree=tree)
    if index and ctx.tree is not None:
        if deadline is not None:
            _setup_fits(ctx, deadline)
        with wait() as progress:
            await _index(ctx, progress)
    return ctx


SGLANG_ENV = ("SGLANG_", "SGL_")
"""The prefixes of the variables SGLang reads as its own settings (`sglang/srt/environ.py`)."""


async def _unit_env(config: Any, transport: Any) -> dict[str, str]:
    """The SGLang variables the unit gives the server (`Environment=`, then `EnvironmentFile=` files
    read on the host, as systemd does), without any named like a secret."""
    from tools.deploy.running import unit_command
    from tools.redact import is_secret_name

    text = Path(config.target.local_unit).read_text()
    _, env, _ = await unit_command(transport, text, unit_path=config.target.remote_unit)
    return {k: v for k, v in env.items() if k.startswith(SGLANG_ENV) and not is_secret_name(k)}


def on_cpu(ctx: DeploymentContext) -> bool:
    """Whether the server runs on the CPU (`--device cpu`, as SGLang's CPU engine reports it)."""
    device = ctx.server_info.get("device") or ctx.unit_flags.get("--device")
    return str(device).lower() == "cpu"


def _setup_fits(ctx: DeploymentContext, deadline: Any) -> None:
    """Raise `BudgetTooSmall` when what research needs first, and this cache lacks, would take longer
    than the run's budget has left: a build of the version's code index, the start-up check's venv.
    Both are made once and kept, so a run with a budget for them (or `optagent research`) makes them."""
    from agent.trial.deadline import BudgetTooSmall
    from tools.research.index import BUILD_SECONDS, index_ready
    from tools.research.startup.resolver import SETUP_SECONDS, ResolverError, worker_ready

    try:
        ready = index_ready(ctx.tree)
    except OSError:  # a cache that fails its check: `_index` records why, and research says so
        return
    needs = [] if ready else [(f"the code index of SGLang {ctx.version}", BUILD_SECONDS)]
    if ctx.model_config is not None:
        with contextlib.suppress(ResolverError):  # a venv that cannot be set up is said by research
            if not worker_ready(ctx.tree):
                needs.append(("the start-up check's venv", SETUP_SECONDS))
    need = sum(s for _, s in needs)
    if not needs or deadline.fits(need):
        return
    what = " and ".join(f"{name} (~{s:.0f} s)" for name, s in needs)
    left = max(0.0, deadline.left() + deadline.closing)
    raise BudgetTooSmall(
        f"research needs {what}, built once for this version and kept, and {left:.0f} s are left of "
        f"{deadline.budget()}. --max-minutes {deadline.minutes_for(need)} would hold the build (the "
        "baseline and trials need more), or `optagent research FLAG` builds it without a budget; nothing "
        "was changed: the known-good configuration serves as before"
    )


async def _index(ctx: DeploymentContext, progress: Any) -> None:
    import asyncio

    from tools.research.index import load_index

    try:
        await asyncio.to_thread(load_index, ctx.tree, progress=progress)
    except Exception as e:  # research reports a damaged index itself; context goes on
        ctx.missing["code index"] = f"{type(e).__name__}: {e}"
    if ctx.model_config is not None:  # the start-up check's venv, set up once per version (~30 s)
        from tools.research.startup.resolver import ResolverError, worker_python

        try:
            await asyncio.to_thread(worker_python, ctx.tree, progress=progress)
        except ResolverError as e:  # each start-up check then says why it did not run
            ctx.missing["start-up check"] = str(e)


async def _model(ctx: DeploymentContext, transport: Any) -> None:
    try:
        from tools.research.target.modelcfg import fetch_model_config, model_facts

        model_path = next((ctx.unit_flags[f] for f in MODEL_FLAGS if ctx.unit_flags.get(f)), None)
        model_path = model_path or (ctx.server_info.get("server_args") or ctx.server_info).get("model_path")
        if not model_path:
            raise ValueError("no --model-path in the unit file or the server args")
        ctx.model_config = await _resolve(fetch_model_config(model_path, transport))
        ctx.model = model_facts(ctx.model_config)
    except Exception as e:
        ctx.missing["model"] = str(e)


async def _source(ctx: DeploymentContext, config: Any, progress: Any = None, *, tree: Any = None) -> None:
    import asyncio

    try:
        from tools.research.flags import flag_catalog
        from tools.research.source import get_source

        r = config.research
        ctx.tree = tree or await asyncio.to_thread(
            get_source, ctx.version, repo_url=r.repo_url, cache_dir=r.cache_dir, source_dir=r.source_dir,
            progress=progress,
        )  # fmt: skip
        ctx.version = ctx.version or ctx.tree.version
        catalog = await asyncio.to_thread(flag_catalog, ctx.tree)
        ctx.catalog = {flag_name(f.name): f for f in catalog}
    except Exception as e:
        ctx.missing["source"] = str(e)


async def _resolve(value: Any) -> Any:
    """Await `value` if the tool was async; tools may be either."""
    import inspect

    return await value if inspect.isawaitable(value) else value
