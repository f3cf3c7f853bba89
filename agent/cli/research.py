"""`optagent flags | research`: the flag catalog and a flag's definition, readers and guards."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer

from agent.cli.common import ConfigOption, console, err_console, fail, get_config, normalize_flag


def _tree(config: Path | None, source: Path | None, version: str | None) -> tuple[Any, Any]:
    """The source tree to read, and the config when one was used to find it."""
    from tools.research.source import SourceError, detect_version, get_source, local_source

    try:
        if source is not None:  # a tree of its own: a deployment's facts only when --config names one
            return local_source(source, version=version), (get_config(config) if config else None)
        cfg = get_config(config)
        research = cfg.research
        if version is None and research.source_dir is not None:
            return local_source(research.source_dir, version=research.version), cfg
        version = version or research.version
        if version is None:
            from tools.deploy.remote import make_transport

            try:
                version = asyncio.run(
                    detect_version(
                        cfg.target.endpoint, transport=make_transport(cfg.target), python=cfg.target.python
                    )
                )
            except SourceError as e:
                start = "`optagent sim up`" if cfg.simulated else f"the server at {cfg.target.endpoint}"
                fail(f"{e}\nstart {start}, or name the version: --version 0.5.23 (or --source DIR)")
        with _waiting() as say:  # a first fetch of a version: tens of seconds
            tree = get_source(version, repo_url=research.repo_url, cache_dir=research.cache_dir, progress=say)
        return tree, cfg
    except SourceError as e:
        fail(str(e))


def flags(
    config: Path | None = ConfigOption,
    source: Path | None = typer.Option(
        None, "--source", help="SGLang source tree (git checkout or unpacked wheel)."
    ),
    version: str | None = typer.Option(None, "--version", help="SGLang version to fetch."),
    grep: str | None = typer.Option(None, "--grep", help="Only flags matching this text."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List every launch_server flag of an SGLang version."""
    from rich.table import Table

    from tools.research.flags import flag_catalog

    tree, _ = _tree(config, source, version)
    catalog = flag_catalog(tree)
    if grep:
        needle = grep.lower()
        catalog = [f for f in catalog if needle in f.name.lower() or needle in f.help.lower()]
    if json_out:
        print(
            json.dumps(
                {"version": tree.version, "origin": tree.origin, "flags": [f.to_dict() for f in catalog]}
            )
        )
        return
    table = Table(title=f"sglang {tree.version} ({tree.origin}): {len(catalog)} flags")
    for column in ("flag", "type", "default", "defined at"):
        table.add_column(column, overflow="fold")
    for f in catalog:
        name = f"{f.name} [yellow](deprecated → {f.replacement or '?'})[/]" if f.deprecated else f.name
        table.add_row(name, f.type or "", repr(f.default), f"{f.path}:{f.line}")
    console.print(table)


def _deployment(cfg: Any, tree: Any) -> tuple[Any, str | None]:
    """The configured deployment's `DeploymentContext`, read as `optagent run` reads it
    (`agent.context.gather_context`: unit file, `/get_server_info`, the model's config.json, the
    GPUs), with `tree` as its source; a piece that cannot be read is in its `missing`. (None, why)
    when there is no deployment to read."""
    if cfg is None:
        return None, None
    if cfg.simulated and not Path(cfg.target.local_unit).exists():
        return None, "no simulated deployment here (`optagent sim up` lays one out)"
    from agent.context import gather_context
    from tools.deploy.remote import make_transport

    async def read() -> Any:
        transport = make_transport(cfg.target)
        try:
            return await gather_context(cfg, transport, index=False, tree=tree)
        finally:
            await transport.close()

    try:
        with err_console.status(f"reading the deployment at {cfg.target.endpoint}..."):
            return asyncio.run(read()), None
    except Exception as e:  # a transport that cannot even be set up: research goes on without it
        return None, f"the deployment at {cfg.target.endpoint} could not be read: {type(e).__name__}: {e}"


def _model_override(ctx: Any, model_config: Path | None) -> Any:
    """`--model-config` in place of the deployment's config.json (exit 2 when it cannot be read)."""
    from agent.context import DeploymentContext
    from tools.research.target.modelcfg import ModelConfigError, load_model_config, model_facts

    ctx = ctx or DeploymentContext()
    if model_config is not None:
        try:
            ctx.model_config = load_model_config(model_config)
            ctx.model = model_facts(ctx.model_config)
        except ModelConfigError as e:
            fail(str(e), code=2)
        ctx.missing.pop("model", None)
    return ctx


def _unknown_flag(name: str, version: str, known: list[str], *, json_out: bool) -> None:
    """Say `name` is no flag of this version, with close names if any, and exit with status 2."""
    import difflib

    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    message = f"{name} is not a launch_server flag of SGLang {version}"
    if close:
        message += f"; did you mean {', '.join(close)}?"
    if json_out:
        print(json.dumps({"flag": name, "version": version, "error": message, "suggestions": close}))
    fail(message, code=2)


def _waiting() -> Any:
    """A long wait shown on stderr while it lasts (`RunUI.waiting`): stdout stays the answer."""
    from agent.ui import RunUI

    return RunUI(err_console).waiting()


def _index(tree: Any, *, rebuild: bool) -> Any:
    """The tree's flag index; building one takes a minute or two, which the user sees on stderr."""
    from tools.research.index import load_index
    from tools.research.source import SourceError

    try:
        with _waiting() as say:
            return load_index(tree, rebuild=rebuild, progress=say)
    except SourceError as e:  # a cache another user could write (`tools.research.cache`)
        fail(str(e))


def _startup(
    tree: Any,
    ctx: Any,
    facts: dict[str, Any],
    name: str,
    value: str | None,
    pairs: list[str],
    tp: int | None,
    info: Any,
) -> Any:
    """SGLang's own start-up with and without the flag, as a run's researcher asks it
    (`DeploymentContext.startup`): the deployment's command line is its unit file's, with the
    --server-arg and --tp given on top, and its model the config.json read (or --model-config);
    the first call sets up its venv."""
    from tools.research.startup.check import (
        argv_of,
        flag_argv,
        hardware_of,
        startup_answer,
        takes_value,
        unit_settings,
    )

    settings = unit_settings(ctx.unit_flags)
    settings.update({k.removeprefix("server."): v for k, v in _server_args(pairs).items()})
    if tp is not None:
        settings["tp_size"] = tp
    config = ctx.model_config_file()

    def ask() -> Any:
        argv = flag_argv(name, value, takes_value=takes_value(info))
        return startup_answer(tree, facts, argv, base_argv=argv_of(settings), model_config=config)

    if hardware_of(facts) is None or config is None:
        return ask()  # an `unknown` that says what is missing
    with err_console.status(
        "SGLang's own start-up, with and without the flag (a version's first run sets up a venv)..."
    ):
        return ask()


CONTEXT = {"ignore_unknown_options": True}
"""`optagent research --enable-x` works without `--`: an unknown option is the flag to research."""


def _server_args(pairs: list[str]) -> dict[str, Any]:
    """`--server-arg attention_backend=triton` pairs as `server.<dest>` facts (values typed)."""
    from tools.flagname import flag_dest
    from tools.research.analysis import parse_literal

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            fail(f"--server-arg wants KEY=VALUE, got {pair!r}", code=2)
        out["server." + flag_dest(key)] = parse_literal(value.strip())
    return out


def research(
    flag: str = typer.Argument(..., help="The flag, with or without dashes (--x, x, x_y, --no-x)."),
    config: Path | None = ConfigOption,
    source: Path | None = typer.Option(None, "--source", help="SGLang source tree."),
    version: str | None = typer.Option(None, "--version", help="SGLang version to fetch."),
    value: str | None = typer.Option(None, "--value", help="The value to try (value flags)."),
    model_config: Path | None = typer.Option(None, "--model-config", help="config.json or its directory."),
    gpu_sm: int | None = typer.Option(None, "--gpu-sm", help="GPU SM architecture, e.g. 120 (RTX PRO 6000)."),
    gpus: int | None = typer.Option(None, "--gpus", help="GPUs on the host."),
    gpu_name: str | None = typer.Option(
        None, "--gpu-name", help="GPU name as nvidia-smi says, e.g. 'NVIDIA H200'."
    ),
    gpu_memory: int | None = typer.Option(
        None, "--gpu-memory", help="GPU memory in MiB as nvidia-smi says, e.g. 81559 (H100 80GB)."
    ),
    tp: int | None = typer.Option(None, "--tp", help="Tensor-parallel size (server.tp_size)."),
    server_arg: list[str] = typer.Option(
        [],
        "--server-arg",
        help="A resolved server arg, KEY=VALUE (repeatable), e.g. attention_backend=triton.",
    ),
    rebuild_index: bool = typer.Option(False, "--rebuild-index", help="Re-index the source tree first."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The verdict of a flag on this deployment, from the code of the running SGLang version.

    With a configured deployment (optagent.toml, or the simulated one `optagent sim up` lays out)
    its facts are read as a run reads them: SGLang version, unit file, resolved server arguments,
    the model's config.json and the GPUs; the options given override them. A value `optagent
    deploy` refuses is refused here, at once, with deploy's reason (one check, `refusals`).
    \f

    One piece because it is a typer command: the facts are assembled in the order the options
    override them, then one verdict is reached and printed; half its length is the option list.
    """
    from agent.cli.research_view import deployment_view, facts_of, print_verdict
    from tools.research.analysis import analyze_flag
    from tools.research.flags import find_flag, flag_catalog

    name = normalize_flag(flag)
    tree, cfg = _tree(config, source, version)
    catalog = flag_catalog(tree)  # a fraction of a second: a name that is no flag needs no index
    info = find_flag(catalog, name)
    if info is None:
        _unknown_flag(name, tree.version, [f.name for f in catalog], json_out=json_out)
    found, why_none = _deployment(cfg, tree)
    ctx = _model_override(found, model_config)
    facts = facts_of(ctx, deployed=found is not None)
    facts.update(_server_args(server_arg))
    if model_config is not None:  # a real model, not `--model-path dummy`
        facts.setdefault("server.model_path", str(model_config))
    for key, given in (("gpu.sm", gpu_sm), ("gpu.count", gpus), ("gpu.name", gpu_name),
                       ("gpu.memory_mib", gpu_memory), ("server.tp_size", tp)):  # fmt: skip
        if given is not None:
            facts[key] = given
    deployment = deployment_view(cfg, found, why_none, tree)
    refused = _deploy_refuses(catalog, tree, info, name, value)
    if refused is not None:  # deploy would not take it: no index, no start-up to wait for
        verdict, decided_by = refused, "deploy check"
    else:
        index = _index(tree, rebuild=rebuild_index)
        startup = _startup(tree, ctx, facts, name, value, server_arg, tp, info)
        verdict = analyze_flag(index, name, facts, value=value, startup=startup)
        decided_by = "start-up" if startup.kind in ("refused", "same") else "code"
        if startup.kind == "unknown":
            verdict.notes.append(f"SGLang's own start-up: {startup.message}")
        if startup.note:  # it ran without bubblewrap: what isolated it instead
            verdict.notes.append(startup.note)
    if json_out:
        data = {"version": tree.version, "origin": tree.origin, **verdict.to_dict(), "decided_by": decided_by}
        print(json.dumps({**data, "deployment": deployment, "facts": facts}, default=str))
        return
    print_verdict(verdict, tree, facts, decided_by=decided_by, deployment=deployment)


def _deploy_refuses(catalog: Any, tree: Any, info: Any, name: str, value: str | None) -> Any:
    """The verdict `refuses-to-start` when `optagent deploy --set` refuses `name` set to `value`
    (the same check: `tools.deploy.flagcheck.refusals`), else None. Deploy refuses what SGLang's
    argparse (type, choices, a switch given a value) or its fixed ranges (`--tp-size 0`) refuse."""
    from tools.deploy.flagcheck import refusals
    from tools.research.findings import CodeVerdict

    if value is None:
        return None
    problems = refusals(catalog, [("set", name, value)], version=tree.version)
    if not problems:
        return None
    why = "; ".join(problems)
    v = CodeVerdict(info.name, info.dest, tree.version, "refuses-to-start", "", 1.0, value=value)
    v.definition = f"{info.path}:{info.line}" if info.path else None
    v.help = info.help
    v.summary = (
        f"`optagent deploy --set {name[2:]}={value}` is refused before any restart: {why}. No trial "
        "can deploy it: there is nothing to measure."
    )
    return v
