"""Scenario files: the hardware, model, baseline flags, noise and timing of one simulated deployment.

The format is documented in `sim/README.md`; `load_scenario` validates it and names the bad key.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCENARIO_DIR = Path(__file__).with_name("scenarios")
BUNDLED_MODELS = Path(__file__).with_name("models")


class ScenarioError(Exception):
    """A scenario that cannot be used; the message names the file, the key and the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Interconnect(_Strict):
    kind: Literal["nvlink", "pcie"]
    bandwidth_gbps: float = Field(gt=0)
    """Effective all-reduce bus bandwidth per GPU, GB/s."""
    latency_us: float = Field(ge=0)
    """Latency of one small all-reduce, microseconds."""


class Hardware(_Strict):
    gpu_name: str
    sm: int = Field(ge=70, le=130)
    """Compute capability times ten (90 = Hopper, 100 = B200, 120 = RTX PRO 6000 Blackwell)."""
    count: int = Field(ge=1, le=16)
    memory_mib: int = Field(gt=1024)
    memory_bandwidth_gbps: float = Field(gt=0)
    bf16_tflops: float = Field(gt=0)
    driver_version: str = "580.95.05"
    interconnect: Interconnect


class ModelSection(_Strict):
    config: str
    """A bundled model name (a folder of `sim/models/`) or a path relative to the scenario file."""
    name: str | None = None
    """Folder name under the host's `models/` (default: the config's folder name)."""
    draft_acceptance: float = Field(0.7, ge=0, le=1)
    """Probability that each speculative draft token is accepted (MTP / EAGLE)."""


class Launch(_Strict):
    flags: list[str] = Field(default_factory=list)
    """Baseline `launch_server` flags, without `--model-path`, `--host` and `--port`."""


class Noise(_Strict):
    run_sigma: float = Field(0.03, ge=0, le=0.5)
    """Spread of the per-launch performance factor (log-normal sigma)."""
    step_sigma: float = Field(0.02, ge=0, le=0.5)
    """Spread of each step's time."""


class Timing(_Strict):
    startup_s: float = Field(30.0, ge=0)
    """Seconds (simulated) from launch to healthy."""
    time_scale: float = Field(1.0, gt=0)
    """Wall seconds per simulated second (0.01 runs a hundred times faster)."""


class Calibration(_Strict):
    bw_efficiency: float = Field(0.75, gt=0, le=1)
    compute_efficiency: float = Field(0.45, gt=0, le=1)
    step_overhead_ms: float = Field(1.0, ge=0)
    launch_overhead_us: float = Field(4.0, ge=0)
    kernels_per_layer: int = Field(14, ge=1)
    graph_launch_us: float = Field(40.0, ge=0)
    spec_overhead_us_per_req: float = Field(60.0, ge=0)
    """Per-request work of each speculative verify (tree masks, rejection sampling, KV bookkeeping)."""


class Scenario(_Strict):
    name: str
    description: str = ""
    hardware: Hardware
    model: ModelSection
    launch: Launch = Field(default_factory=Launch)
    noise: Noise = Field(default_factory=Noise)
    timing: Timing = Field(default_factory=Timing)
    calibration: Calibration = Field(default_factory=Calibration)
    source: Path | None = None

    @property
    def model_dir(self) -> Path:
        """The folder holding the scenario's `config.json`."""
        ref = Path(self.model.config)
        if self.source is not None and (self.source.parent / ref).exists():
            path = (self.source.parent / ref).resolve()
            return path.parent if path.is_file() else path
        return BUNDLED_MODELS / self.model.config

    @property
    def model_name(self) -> str:
        return self.model.name or self.model_dir.name


def list_scenarios() -> list[str]:
    """Names of the bundled scenarios."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def load_scenario(ref: str | Path) -> Scenario:
    """Load a bundled scenario by name (`seed`) or a scenario file by path."""
    path = Path(ref)
    if not path.suffix and not path.exists():
        path = SCENARIO_DIR / f"{ref}.toml"
        if not path.exists():
            raise ScenarioError(f"unknown scenario {str(ref)!r} (bundled: {', '.join(list_scenarios())})")
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as e:
        raise ScenarioError(f"{path}: no such scenario file") from e
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{path}: not valid TOML: {e}") from e
    try:
        scenario = Scenario.model_validate({**data, "source": path.resolve()})
    except ValidationError as e:
        lines = [f"{path}: invalid scenario"]
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {key}: {'unknown key' if err['type'] == 'extra_forbidden' else err['msg']}")
        raise ScenarioError("\n".join(lines)) from e
    if not (scenario.model_dir / "config.json").is_file():
        raise ScenarioError(f"{path}: model.config: no config.json at {scenario.model_dir}")
    return scenario
