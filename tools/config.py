"""optagent's configuration: a validated pydantic model read from `optagent.toml`.

With no config file the target is the simulated deployment in `.optagent/sim/` and the model is the
builtin policy (unless `OPENAI_API_KEY`/`OPENAI_BASE_URL` select an LLM).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DEFAULT_SIM_DIR = Path(".optagent/sim")
CONFIG_NAME = "optagent.toml"
Workload = Literal["random", "shared-prefix", "multiturn"]


class ConfigError(Exception):
    """A config file that cannot be used; the message names the key and the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TargetConfig(_Strict):
    """How to reach the host, manage the service and talk to the server."""

    transport: Literal["local", "ssh"] = "local"
    host: str = "127.0.0.1"
    user: str | None = None
    ssh_port: int = Field(22, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    insecure_no_host_key_check: bool = False
    connect_timeout_s: float = Field(15.0, gt=0)
    command_timeout_s: float = Field(120.0, gt=0)

    service_manager: Literal["systemd", "process"] = "process"
    sudo: bool = False
    service: str = "sglang"
    local_unit: Path = DEFAULT_SIM_DIR / "local" / "sglang.service"
    remote_unit: str = str(DEFAULT_SIM_DIR / "sglang.service")
    run_dir: str = str(DEFAULT_SIM_DIR / "run")
    """Where the process manager keeps the PID file and the log on the host."""
    nvidia_smi: str = "nvidia-smi"
    python: str = "python3"
    """The host's Python that has sglang installed (for `pip show`, `--help`, bench_serving)."""

    endpoint: str = "http://127.0.0.1:30000"
    api_key: str | None = Field(None, repr=False)
    """The server's `--api-key` (sent as a bearer token); `$OPTAGENT_API_KEY` is used when unset."""
    health_timeout_s: float = Field(900.0, gt=0)
    deadman_s: float = Field(1800.0, gt=0)
    """Dead-man's switch: the host restores known-good unless optagent confirms within this time."""
    max_restarts_per_minute: int = Field(6, ge=1)
    max_restarts_per_day: int = Field(200, ge=1)
    """Restarts optagent may cause on this target in any 24 hours, all runs and commands together (a
    deploy beyond it is refused; a rollback never is). A run's own budget is `[agent] max_restarts`."""
    max_consecutive_failures: int = Field(3, ge=1)
    state_dir: Path = Path(".optagent/state")
    """Local directory for the journal, the known-good copy and backups."""

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")


class BenchConfig(_Strict):
    """Benchmark settings used for baselines and trials."""

    api: Literal["completions", "chat", "generate"] = "completions"
    concurrency: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    input_len: int = Field(1024, ge=1)
    output_len: int = Field(256, ge=1)
    prompts_per_level: int = Field(0, ge=0)
    """0 = scaled to the level."""
    workload: Workload | dict[Workload, float] = "random"
    """What each level sends: `random` prompts (no two share a prefix), `shared-prefix` (groups of
    prompts sharing a long system prompt, like bench_serving's generated-shared-prefix dataset; the
    `gsp_*` keys below mirror its `--gsp-*` flags), `multiturn` (conversations whose history grows
    and is sent again every turn, like SGLang's bench_multiturn; the `multiturn_*` keys), or the
    production mix as fractions of conversations (a single prompt is a conversation of one turn),
    e.g. `workload = { random = 0.2, shared-prefix = 0.3, multiturn = 0.5 }`. Left unset, a trial of
    a flag that touches caching, scheduling or memory is measured on half random, half shared-prefix
    prompts (`tools.bench.workload.workload_for`)."""
    gsp_num_groups: int = Field(64, ge=1)
    gsp_prompts_per_group: int = Field(16, ge=1)
    gsp_system_prompt_len: int = Field(2048, ge=1)
    gsp_question_len: int = Field(128, ge=1)
    gsp_output_len: int = Field(256, ge=1)
    multiturn_num_rounds: int = Field(5, ge=1)
    """Turns of each conversation (bench_multiturn's `--num-rounds`); a level holds as many
    conversations as it would send prompts (`prompts_per_level`, or max(8, 2 x its concurrency))."""
    multiturn_request_length: int = Field(512, ge=1)
    """Tokens of a conversation's first turn (`--request-length`)."""
    multiturn_sub_question_input_length: int = Field(0, ge=0)
    """Tokens of the question each later turn adds (`--sub-question-input-length`; 0: the
    request length)."""
    multiturn_output_length: int = Field(64, ge=1)
    """Tokens of every answer (`--output-length`), which the next turn's history carries."""
    vocab_size: int | None = Field(None, ge=2)
    """The model's vocabulary size: random prompts' token ids are drawn below it (unset: ids
    1000-30000, in every common vocabulary). A run fills it from the model's `config.json`."""
    warmup: int = Field(2, ge=0)
    reps: int = Field(3, ge=1)
    min_effect: float = Field(0.02, ge=0)
    regress_tolerance: float = Field(0.03, ge=0)
    launch_noise: float = Field(0.01, ge=0, lt=1)
    """Restart-to-restart spread of throughput (relative sd) that repetitions in one launch can't see:
    the declared figure, used only until one is measured (`launch_spread`, `spread_launches`)."""
    launch_spread: float | None = Field(None, ge=0, lt=1)
    """The restart spread measured on this deployment (`optagent bench --restarts N` records it with
    `launch_spread_df`); a run uses it instead of `launch_noise`."""
    launch_spread_df: int = Field(0, ge=0)
    """Degrees of freedom of `launch_spread` (launches measured - 1)."""
    spread_launches: int = Field(2, ge=0)
    """Extra launches of known-good the baseline phase measures when no `launch_spread` is recorded
    (each a restart; 0: trust `launch_noise`)."""
    time_scale: float = Field(1.0, gt=0)
    """Wall seconds per second of the server's own clock: 1 for a real server; the simulated
    deployment's clock may run faster than the GPUs it models (0.5: twice as fast). Every time a
    benchmark measures is divided by it, so its figures are in the server's seconds; budgets,
    timeouts and restarts stay in wall seconds."""
    request_timeout_s: float = Field(600.0, gt=0)
    """The longest one benchmark request may take in all."""
    stall_timeout_s: float = Field(120.0, gt=0)
    """Seconds without a byte before a request counts as stalled; a stalled request stops its sweep
    (the server stopped answering: the rest would wait as long), so a candidate that hangs mid-stream
    is out of a trial within this."""
    backend: Literal["optagent", "sglang"] = "optagent"
    goodput_limits: dict[str, float] = Field(default_factory=dict)
    """Latency limits in ms by statistic (`{ p99_ttft_ms = 300, p99_tpot_ms = 40 }`): when set, every
    sweep is a goodput search (`tools.bench.goodput`): its one level, at `concurrency`'s single value
    (requests per rate run, none held back by the client), carries the highest Poisson request rate
    meeting every limit. A goodput goal sets it."""

    @field_validator("goodput_limits")
    @classmethod
    def _latency_statistics(cls, v: dict[str, float]) -> dict[str, float]:
        import re

        for name, ms in v.items():
            if not re.fullmatch(r"(mean|median|p90|p95|p99)_(ttft|tpot|itl|e2e_latency)_ms", name):
                raise ValueError(f"{name!r} is no latency statistic (e.g. p99_ttft_ms, median_tpot_ms)")
            if not ms > 0:
                raise ValueError(f"the limit of {name} must be above 0 ms, got {ms}")
        return v

    @field_validator("workload")
    @classmethod
    def _fractions(cls, v: Any) -> Any:
        if isinstance(v, dict) and (
            not v or any(f <= 0 for f in v.values()) or abs(sum(v.values()) - 1) > 1e-6
        ):
            raise ValueError("a mix must give each workload a positive fraction, summing to 1")
        return v

    @model_validator(mode="after")
    def _goodput_runs_at_one_size(self) -> BenchConfig:
        if self.goodput_limits and len(self.concurrency) != 1:
            raise ValueError(
                "goodput_limits needs one concurrency value: the requests of each rate run (e.g. [200])"
            )
        if self.goodput_limits and self.backend == "sglang":
            raise ValueError("the goodput search runs with optagent's client, not backend = 'sglang'")
        return self

    @model_validator(mode="after")
    def _bench_serving_sends_no_multiturn(self) -> BenchConfig:
        if self.backend == "sglang" and "multiturn" in (
            [self.workload] if isinstance(self.workload, str) else self.workload
        ):
            raise ValueError(
                "backend 'sglang' cannot send the multiturn workload (bench_serving's own multi-turn "
                "holds a slot per conversation and needs the chat API): use backend 'optagent'"
            )
        return self

    @field_validator("concurrency")
    @classmethod
    def _positive_levels(cls, v: list[int]) -> list[int]:
        if not v or any(c < 1 for c in v):
            raise ValueError("must be a non-empty list of positive integers")
        return sorted(set(v))


class AgentConfig(_Strict):
    """Which model plans, and the budget of a run."""

    model: str = "builtin"
    base_url: str | None = None
    max_trials: int = Field(12, ge=0)
    max_restarts: int | None = Field(None, ge=0)
    """Restarts of the target a run may spend on trials (None: one per lever of the playbook not set
    already, half of trying each alone, at least 8; `--max-restarts` overrides it)."""
    max_wall_minutes: float = Field(240.0, gt=0)
    max_minutes: float | None = Field(None, gt=0)
    """Wall-time budget of `optagent run` in minutes (overrides max_wall_minutes when set;
    `--max-minutes` overrides both)."""
    max_parallel_research: int = Field(4, ge=1)
    max_tokens: int | None = Field(None, gt=0)
    """Model tokens (input and output, planner and researchers) a run may spend; the run stops
    cleanly, on its best configuration, when they are spent (None: no limit)."""
    allow_lossy: bool = False
    transcripts_dir: Path = Path("transcripts")


class ResearchConfig(_Strict):
    """Where the SGLang source of the running version comes from."""

    repo_url: str = "https://github.com/sgl-project/sglang.git"
    source_dir: Path | None = None
    cache_dir: Path | None = None
    """Defaults to the user cache directory (platformdirs)."""
    version: str | None = None
    """Override the version detected from the server."""


class Config(_Strict):
    """The whole optagent.toml."""

    target: TargetConfig = Field(default_factory=TargetConfig)
    bench: BenchConfig = Field(default_factory=BenchConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    research: ResearchConfig = Field(default_factory=ResearchConfig)
    simulated: bool = False
    """True when this config points at the embedded simulated deployment."""


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the table at `loc[:-1]` accepts (its model's fields)."""
    model: Any = Config
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(str(part))
        if field is None or not isinstance(field.annotation, type):
            return []
        model = field.annotation
    return [name for name in getattr(model, "model_fields", {}) if name != "simulated"]


def _describe(err: ValidationError, path: Path) -> str:
    import difflib

    lines = [f"{path}: invalid configuration"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(e["loc"][-1]), _known_keys(e["loc"]), n=1, cutoff=0.6)
            msg = "unknown key" + (f"; did you mean {close[0]!r}?" if close else "")
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def load_config(path: Path | None = None) -> Config:
    """Read `path`, or `./optagent.toml`, or fall back to the simulated deployment's config."""
    if path is None:
        if not Path(CONFIG_NAME).exists():
            return sim_config()
        path = Path(CONFIG_NAME)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: no such config file") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8") from e
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    try:
        config = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_describe(e, path)) from e
    return _anchor_paths(config, path.resolve().parent)


def record_settings(path: Path, table: str, values: dict[str, Any]) -> None:
    """Set `values` in `[table]` of the config file `path`, keeping everything else in it as written
    (comments, order, other keys; tomlkit edits the document). The result must read back as a valid
    config holding exactly those changes before it replaces the file, atomically and with the same
    permissions; otherwise the file is left as it was (`ConfigError`)."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    from tools.localfiles import write_text

    path = Path(path).resolve()
    try:
        text = path.read_text()
        old, doc = tomllib.loads(text), tomlkit.parse(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, TOMLKitError) as e:
        raise ConfigError(f"{path}: cannot record {table}.{', '.join(values)}: {e}") from e
    doc.setdefault(table, tomlkit.table()).update(values)
    new = tomlkit.dumps(doc)
    expected = {**old, table: {**old.get(table, {}), **values}}
    try:
        Config.model_validate(tomllib.loads(new))
        if tomllib.loads(new) != expected:
            raise ValueError("the edit would change other settings")
    except (ValueError, tomllib.TOMLDecodeError) as e:  # ValidationError is a ValueError
        raise ConfigError(f"{path}: not changed, the edit did not read back as intended: {e}") from e
    try:
        write_text(path, new)  # its mode kept; never through a link planted at its name
    except OSError as e:
        raise ConfigError(f"{path}: cannot write: {e.strerror or e}") from e


def _anchor_paths(config: Config, base: Path) -> Config:
    """Relative local paths mean "next to the config file", whatever directory optagent runs from.

    Otherwise `recover` run from another directory would look for the journal in the wrong place.
    """

    def anchored(p: Path | None) -> Path | None:
        return p if p is None or p.expanduser().is_absolute() else base / p

    t, a, r = config.target, config.agent, config.research
    return config.model_copy(
        update={
            "target": t.model_copy(
                update={"local_unit": anchored(t.local_unit), "state_dir": anchored(t.state_dir)}
            ),
            "agent": a.model_copy(update={"transcripts_dir": anchored(a.transcripts_dir)}),
            "research": r.model_copy(
                update={"source_dir": anchored(r.source_dir), "cache_dir": anchored(r.cache_dir)}
            ),
        }
    )


def sim_config(sim_dir: Path = DEFAULT_SIM_DIR, *, port: int | None = None) -> Config:
    """The config of the simulated deployment laid out by `optagent sim up` in `sim_dir`.

    The port is read from `sim_dir/endpoint` (written by `sim up`) unless given.
    """
    sim_dir = Path(sim_dir).resolve()
    endpoint = "http://127.0.0.1:30000"
    if port is not None:
        endpoint = f"http://127.0.0.1:{port}"
    elif (sim_dir / "endpoint").exists():
        endpoint = (sim_dir / "endpoint").read_text().strip()
    target = TargetConfig(
        transport="local",
        service_manager="process",
        local_unit=sim_dir / "local" / "sglang.service",
        remote_unit=str(sim_dir / "sglang.service"),
        run_dir=str(sim_dir / "run"),
        nvidia_smi=str(sim_dir / "bin" / "nvidia-smi"),
        endpoint=endpoint,
        health_timeout_s=120.0,
        deadman_s=600.0,
        state_dir=sim_dir / "state",
    )
    bench = BenchConfig(
        concurrency=[1, 8, 64], input_len=1024, output_len=256, reps=3, time_scale=_sim_time_scale(sim_dir)
    )
    return Config(target=target, bench=bench, simulated=True)


def _sim_time_scale(sim_dir: Path) -> float:
    """How fast the simulated deployment's clock runs (`sim.json`'s `time_scale`; 1 when unknown)."""
    import json

    try:
        return float(json.loads((sim_dir / "sim.json").read_text()).get("time_scale") or 1.0)
    except (OSError, ValueError, TypeError, AttributeError):
        return 1.0
