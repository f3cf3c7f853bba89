"""The alternative backend: SGLang's own `python -m sglang.bench_serving`, run on the host.

For users who trust SGLang's client: each level is one bench_serving run through the transport;
its JSONL result is read back and mapped onto the same `LevelResult` model.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import socket
import uuid
from datetime import UTC, datetime
from typing import Any

from tools.auth import api_key
from tools.bench.results import LevelResult, SweepResult
from tools.bench.workload import prompts_for_level, workload_mix
from tools.config import BenchConfig
from tools.deploy.remote import Transport, TransportError
from tools.redact import redact_text

BACKENDS = {"completions": "sglang-oai", "chat": "sglang-oai-chat", "generate": "sglang"}
_URL = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/\-]*)?$")
_PATH = re.compile(r"^[A-Za-z0-9._/\-]+$")
_COPIED = [
    "duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "input_throughput", "output_throughput", "total_throughput", "concurrency", "max_itl_ms",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2e_latency") for s in ("mean", "median", "p90", "p95", "p99")),
]  # fmt: skip


class BenchServingError(ValueError):
    """bench_serving's output could not be used; the message says why."""


def bench_serving_argv(
    endpoint: str,
    settings: BenchConfig,
    *,
    concurrency: int,
    output_file: str,
    python: str = "python3",
    seed: int = 0,
    request_rate: float | None = None,
) -> list[str]:
    """The command line for one level. Values are validated; the argv never goes through a shell
    on a local host, and the SSH transport quotes each element."""
    if not _URL.match(endpoint):
        raise ValueError(f"not a plain http(s) URL: {endpoint!r}")
    if not _PATH.match(output_file) or not _PATH.match(python):
        raise ValueError("python and output_file must be plain paths")
    rate = "inf" if request_rate is None else repr(float(request_rate))
    n = prompts_for_level(settings, concurrency)
    mix = workload_mix(settings)
    if len(mix) > 1:
        raise ValueError("bench_serving runs one dataset at a time; a workload mix needs backend 'optagent'")
    if "shared-prefix" in mix:  # as tools.bench.prompts.shared_prefix_prompts shapes a level
        groups = max(1, min(settings.gsp_num_groups, -(-n // settings.gsp_prompts_per_group)))
        dataset = [
            "--dataset-name", "generated-shared-prefix",
            "--gsp-num-groups", str(groups),
            "--gsp-prompts-per-group", str(settings.gsp_prompts_per_group),
            "--gsp-system-prompt-len", str(settings.gsp_system_prompt_len),
            "--gsp-question-len", str(settings.gsp_question_len),
            "--gsp-output-len", str(settings.gsp_output_len),
        ]  # fmt: skip
    else:
        dataset = [
            "--dataset-name", "random-ids",
            "--random-input-len", str(settings.input_len),
            "--random-output-len", str(settings.output_len),
            "--random-range-ratio", "1.0",
        ]  # fmt: skip
    return [
        python, "-m", "sglang.bench_serving",
        "--backend", BACKENDS[settings.api],
        "--base-url", endpoint.rstrip("/"),
        *dataset,
        "--num-prompts", str(n),
        "--max-concurrency", str(concurrency),
        "--request-rate", rate,
        "--warmup-requests", str(settings.warmup),
        "--seed", str(seed),
        "--output-file", output_file,
    ]  # fmt: skip


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def parse_bench_serving(text: str, *, concurrency: int, num_prompts: int) -> tuple[LevelResult, dict | None]:
    """Map bench_serving's result (the last JSON line of its output file) onto a `LevelResult`;
    also returns the `server_info` it recorded. With no completed request every statistic is
    None (bench_serving writes 0 or NaN there)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise BenchServingError("bench_serving wrote an empty result file")
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise BenchServingError(f"bench_serving result is not JSON: {e.msg}") from e
    if not isinstance(data, dict) or "completed" not in data:
        raise BenchServingError("bench_serving result has no `completed` field")
    completed = int(data["completed"])
    fields: dict[str, Any] = {
        "max_concurrency": data.get("max_concurrency") or concurrency,
        "num_prompts": num_prompts,
    }
    rate = _number(data.get("request_rate"))
    fields["request_rate"] = rate if rate is not None and math.isfinite(rate) else None
    if completed > 0:
        for key in _COPIED:
            if (value := _number(data.get(key))) is not None:
                fields[key] = int(value) if key.startswith(("total_", "completed")) else value
    fields["completed"] = completed
    fields["failed"] = max(num_prompts - completed, 0)
    errors: dict[str, int] = {}
    for err in data.get("errors") or []:
        if err:
            cause = str(err).strip().splitlines()[-1][:200]
            errors[cause] = errors.get(cause, 0) + 1
    if fields["failed"] and not errors:
        errors["request failed in bench_serving (run with --output-details for causes)"] = fields["failed"]
    fields["errors"] = errors
    info = data.get("server_info")
    return LevelResult(**fields), info if isinstance(info, dict) else None


async def run_sweep_sglang(
    transport: Transport,
    endpoint: str,
    settings: BenchConfig,
    *,
    python: str = "python3",
    seed: int = 0,
    request_rate: float | None = None,
    remote_dir: str = "/tmp",
) -> SweepResult:
    """One sweep with bench_serving on the host behind `transport` (a `tools.deploy.remote.Transport`).
    A failed run ends the sweep as a partial result with bench_serving's stderr tail."""
    result = SweepResult(
        backend="sglang", endpoint=redact_text(endpoint.rstrip("/")), api=settings.api, seed=seed,
        settings={**settings.model_dump(mode="json"), "request_rate": request_rate},
        client_host=getattr(transport, "description", "") or socket.gethostname(),
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )  # fmt: skip
    for c in settings.concurrency:
        n = prompts_for_level(settings, c)
        out = f"{remote_dir.rstrip('/')}/optagent-bench-{uuid.uuid4().hex}.jsonl"
        argv = bench_serving_argv(endpoint, settings, concurrency=c, output_file=out, python=python,
                                  seed=seed, request_rate=request_rate)  # fmt: skip
        key = api_key()
        if key:  # bench_serving reads OPENAI_API_KEY; through stdin, never in an argv `ps` can show
            argv = ["sh", "-c", 'IFS= read -r OPENAI_API_KEY; export OPENAI_API_KEY; exec "$@"', "sh", *argv]
        try:
            run = await transport.run(
                argv, timeout=settings.request_timeout_s * (2 + n / c), input=f"{key}\n" if key else None
            )
            if run.returncode != 0:
                tail = " | ".join((run.stderr or run.stdout).strip().splitlines()[-3:])
                raise BenchServingError(f"bench_serving exited {run.returncode}: {tail}")
            level, info = parse_bench_serving(await transport.read_file(out), concurrency=c, num_prompts=n)
        except (BenchServingError, TransportError, OSError, TimeoutError) as e:
            result.errors.append(f"concurrency {c}: {e}")
            break
        finally:
            with contextlib.suppress(TransportError, OSError):
                await transport.run(["rm", "-f", out], timeout=30)
        result.server_info = result.server_info or info
        result.levels.append(level)
    missing = [c for c in settings.concurrency if result.level(c) is None]
    if missing:
        result.errors.append(f"levels not measured: {', '.join(map(str, missing))}")
    result.partial = bool(result.errors) or any(not lv.ok for lv in result.levels)
    result.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
    return result
