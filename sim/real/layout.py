"""A real SGLang deployment on this machine's CPU, laid out like the simulated host (`sim.host`).

    sglang.service          the "remote" unit: the venv's `python -m sglang.launch_server ... --device cpu`
    local/sglang.service    the local source-of-truth copy
    run/                    PID file and log of the process manager
    endpoint, sim.json      where it listens; `engine = "sglang"`, the venv and model it runs
    optagent.toml           a config for `optagent ... --config` that points at all of this

The unit is a plausible production one with something left to find, as the user story's was: a
cautious `--max-running-requests 2` below the traffic's concurrency of 8 (the benchmark in
`optagent.toml`), so requests queue instead of batching.
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.host import SERVICE, pick_port, unit_text
from sim.real.environment import SGLANG_VERSION, RealEnvironment

DEFAULT_REAL_DIR = Path(".optagent/real")
# What SGLang's CPU path needs (SGLang's own CPU recipe): the torch-native attention, no CUDA graphs;
# and an idle scheduler that waits on its sockets (0.5.23 IdleSleeper) instead of spinning: idle,
# it took ~76% of a core here, ~1% with the flag (on two cores, several servers would starve).
CPU_FLAGS = [
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--disable-cuda-graph",
    "--sleep-on-idle",
]
# A deployment someone set up cautiously: a small KV pool, and a batch cap below the traffic.
PRODUCTION_FLAGS = [
    "--mem-fraction-static",
    "0.5",
    "--max-total-tokens",
    "4096",
    "--max-running-requests",
    "2",
]
ENVIRONMENT = {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
# The traffic: up to 8 requests at once, short prompts and outputs (a tiny model on two cores);
# the shared-prefix workload sized to fit the 4,096-token KV pool at the highest level.
BENCH = {
    "concurrency": [1, 4, 8],
    "input_len": 256,
    "output_len": 64,
    "warmup": 1,
    "reps": 3,
    "gsp_num_groups": 4,
    "gsp_prompts_per_group": 8,
    "gsp_system_prompt_len": 512,
    "gsp_question_len": 32,
    "gsp_output_len": 64,
    "request_timeout_s": 120.0,
    "vocab_size": 2048,  # tinymodel.VOCAB: ids past it would fail the batch
}


def render_unit(env: RealEnvironment, *, port: int) -> str:
    """The systemd unit text of the real deployment's first launch."""
    argv = [str(env.python), "-m", "sglang.launch_server", "--model-path", str(env.model_dir)]
    argv += [*CPU_FLAGS, *PRODUCTION_FLAGS, "--host", "127.0.0.1", "--port", str(port)]
    description = (
        f"SGLang {SGLANG_VERSION} server on the CPU (tiny Llama, laid out by optagent sim up --real)"
    )
    return unit_text(description, ENVIRONMENT, argv, program_words=3)


def render_config(host_dir: Path, env: RealEnvironment, *, port: int) -> str:
    """`optagent.toml` for this deployment: local transport, the process manager, the CPU traffic."""
    import tomlkit

    doc = tomlkit.document()
    doc.add(tomlkit.comment("A real SGLang server on this machine's CPU (optagent sim up --real)."))
    doc["target"] = {
        "transport": "local",
        "service_manager": "process",
        "service": SERVICE,
        "local_unit": str(host_dir / "local" / f"{SERVICE}.service"),
        "remote_unit": str(host_dir / f"{SERVICE}.service"),
        "run_dir": str(host_dir / "run"),
        "python": str(env.python),
        "endpoint": f"http://127.0.0.1:{port}",
        "health_timeout_s": 300.0,
        "deadman_s": 900.0,
        "state_dir": str(host_dir / "state"),
    }
    doc["bench"] = BENCH
    doc["agent"] = {"transcripts_dir": "transcripts"}
    return tomlkit.dumps(doc)


def create(host_dir: Path, env: RealEnvironment, *, port: int | None = None) -> Path:
    """Lay out the real deployment in `host_dir` (not started); return its `optagent.toml`."""
    host_dir = Path(host_dir).resolve()
    chosen = pick_port(port)
    for sub in ("local", "run"):
        (host_dir / sub).mkdir(parents=True, exist_ok=True)
    unit = render_unit(env, port=chosen)
    (host_dir / f"{SERVICE}.service").write_text(unit)
    (host_dir / "local" / f"{SERVICE}.service").write_text(unit)
    (host_dir / "endpoint").write_text(f"http://127.0.0.1:{chosen}\n")
    meta = {"engine": "sglang", "version": SGLANG_VERSION, "python": str(env.python),
            "model": str(env.model_dir), "port": chosen}  # fmt: skip
    (host_dir / "sim.json").write_text(json.dumps(meta, indent=2) + "\n")
    config = host_dir / "optagent.toml"
    config.write_text(render_config(host_dir, env, port=chosen))
    (host_dir / "README.md").write_text(
        f"# A real SGLang {SGLANG_VERSION} deployment on this machine's CPU\n\n"
        "Laid out by `optagent sim up --real`; `optagent sim down --dir .` stops it.\n\n"
        "Its unit starts a tiny random Llama with SGLang's CPU engine. Left to find, as in production: "
        "`--max-running-requests 2` while the traffic in `optagent.toml` reaches 8 requests at once.\n\n"
        f'    optagent run --config {config} --goal "improve throughput"\n'
    )
    return config
