"""SGLang's own start-up resolution for a CPU deployment (SGLang's CPU engine), on its host's facts.

The deployment is the real one `optagent sim up --real` lays out (`sim/real/layout.py`: `--device
cpu --attention-backend torch_native ... --max-running-requests 2`, `SGLANG_USE_CPU_ENGINE=1`),
its context gathered as a run gathers it (the host's CPU facts over the context's transport), its
source the installed 0.5.23. Each expected outcome was written from the 0.5.23 source before the
code ran (`file:line` below, under `sglang/srt/`); the resolved configuration is compared with what
the real server reports in `/get_server_info`, and the host's facts with what SGLang itself reads
on this machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from typing import Any

import httpx
import pytest

from tools.deploy.remote import LocalTransport
from tools.research.startup.check import hardware_of, startup_answer
from tools.research.target.cpu import parse_cpu_facts, read_cpu

pytestmark = pytest.mark.slow(seconds=90)

# What the real server's /get_server_info and SGLang's own resolution of its unit may differ in:
DIFFERENT = {
    # the resolver serves its own copy of the model's config.json (check.MODEL_FLAGS)
    "model_path", "tokenizer_path", "served_model_name",
    # drawn at random when the command line gives none (the resolver seeds `random` with 0)
    "random_seed",
    # the server hides these in /get_server_info (a key and its config): "<redacted>" there
    "watermark_key", "watermark_key_b", "watermark_config",
}  # fmt: skip


@pytest.fixture(scope="module")
def cpu_ctx(real_host, sglang_0523):  # type: ignore[no-untyped-def]
    """The real CPU deployment's context, gathered as `optagent run` gathers it."""
    from agent.context import gather_context
    from tools.deploy.remote import make_transport

    config = real_host.config
    return asyncio.run(gather_context(config, make_transport(config.target), index=False, tree=sglang_0523))


def _ask(ctx: Any, facts: dict[str, Any], flag: list[str]) -> Any:
    """The start-up answer for `flag` on the deployment's command line, with `facts` (a host's)."""
    from tools.research.startup.check import argv_of, unit_settings

    base = argv_of(unit_settings(ctx.unit_flags))
    return startup_answer(ctx.tree, facts, flag, base_argv=base, model_config=ctx.model_config_file())


def test_the_hosts_facts_are_what_sglang_itself_reads_there(real_env) -> None:  # type: ignore[no-untyped-def]
    """The facts read over the transport give the memory SGLang's own `get_cpu_memory_capacity()`
    computes on this host (utils/common.py:911-927), its NUMA count (:4517), arch (:202-217) and AMX
    answer (:366), asked of the real SGLang in the real server's venv."""
    facts = asyncio.run(read_cpu(LocalTransport()))
    assert facts.unknown == {} and set(facts.known()) == {
        "arch", "count", "memory_mib", "memory_max", "numa_nodes", "amx"
    }  # fmt: skip
    probe = (
        "import json, os, platform, torch\n"
        "from sglang.srt.utils.common import get_cpu_ids_by_node, get_cpu_memory_capacity, is_cpu\n"
        "print(json.dumps([get_cpu_memory_capacity(), len(get_cpu_ids_by_node()), platform.machine(),\n"
        "    bool(torch.cpu._is_amx_tile_supported()), is_cpu(), len(os.sched_getaffinity(0))]))\n"
    )
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    done = subprocess.run(
        [str(real_env.python), "-c", probe], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    capacity, nodes, arch, amx, cpu_engine, allowed = json.loads(done.stdout.strip().splitlines()[-1])
    total = round(facts.memory_mib * 2**20)
    limit = total if facts.memory_max == "max" else min(total, facts.memory_max)
    assert cpu_engine is True
    assert capacity == float(limit / (facts.numa_nodes or 1) // 2**20)
    assert (nodes, arch, amx, allowed) == (facts.numa_nodes, facts.arch, facts.amx, facts.count)


def test_numa_nodes_are_counted_as_sglang_counts_them() -> None:
    """A two-socket host with two threads per core, the process bound to socket 1's second threads
    only: SGLang keeps the first CPU of each core (common.py:4490-4495), so node 1 has none allowed,
    node 0 none either: 0 nodes (it then divides by 1, :920). Bound to all of node 1: 1 node."""
    lscpu = "# CPU,Core,Socket,Node\n" + "".join(
        f"{cpu},{cpu % 4},{cpu % 4 // 2},{cpu % 4 // 2}\n" for cpu in range(8)
    )  # CPUs 0-3 are the first threads of cores 0-3 (cores 0-1 on node 0), 4-7 their siblings

    def read(allowed: str, limit: str = "max") -> Any:
        text = (
            f"@@arch\nx86_64\n@@meminfo\nMemTotal: 65536000 kB\n@@memory.max\n{limit}\n"
            f"@@allowed\nCpus_allowed_list:\t{allowed}\n@@lscpu\n{lscpu}@@flags\nflags\t: fpu sse2 avx2\n"
        )
        return parse_cpu_facts(text)

    siblings = read("6-7")
    assert (siblings.numa_nodes, siblings.count, siblings.amx) == (0, 2, False)
    node1 = read("2-3,6-7", limit="17179869184")
    assert (node1.numa_nodes, node1.count, node1.memory_max, node1.memory_mib) == (1, 4, 17179869184, 64000)
    assert read("0-7").numa_nodes == 2 and read("0-7", limit="max").memory_max == "max"
    text = "@@arch\nx86_64\n@@allowed\nCpus_allowed_list:\t0-1\n@@lscpu\nsh: 1: lscpu: not found\n"
    missing = parse_cpu_facts(text)
    assert missing.numa_nodes is None and "lscpu: not found" in missing.unknown["numa_nodes"]
    assert set(missing.unknown) == {"memory_mib", "memory_max", "numa_nodes", "amx"}


def test_the_context_of_a_cpu_deployment_holds_its_hosts_facts_and_sglang_variables(cpu_ctx) -> None:  # type: ignore[no-untyped-def]
    facts = cpu_ctx.facts
    assert facts["gpu.count"] == 0 and facts["flag.device"] == "cpu"
    host = asyncio.run(read_cpu(LocalTransport())).known()
    assert {k: facts[f"cpu.{k}"] for k in host} == host
    assert facts["env.SGLANG_USE_CPU_ENGINE"] == "1"
    assert not [k for k in facts if k.startswith("env.") and not k.startswith(("env.SGLANG_", "env.SGL_"))]
    hw = hardware_of(facts)
    assert hw is not None and hw["count"] == 0 and hw["cpu"] == host


def test_the_resolution_on_the_hosts_facts_is_what_the_real_server_runs(cpu_ctx, real_host) -> None:  # type: ignore[no-untyped-def]
    """Every resolved argument equals the real server's, sizes SGLang picks from the host included
    (chunked_prefill_size from get_cpu_memory_capacity(), memory_hook.py:78-180; the CPU graph's
    torch_compile_max_bs and batch sizes, :199-230), but for `DIFFERENT`."""
    answer = cpu_ctx.startup("--max-running-requests", "8")
    info = httpx.get(f"{real_host.endpoint}/get_server_info", timeout=30).json()
    assert answer.baseline["chunked_prefill_size"] == info["chunked_prefill_size"]
    assert answer.baseline["cuda_graph_config"] == info["cuda_graph_config"]
    differ = {k for k, v in answer.baseline.items() if k in info and info[k] != v}
    assert differ == DIFFERENT, {k: (answer.baseline[k], info[k]) for k in differ - DIFFERENT}
    assert not set(answer.baseline) - set(info)


def test_a_larger_batch_cap_changes_the_cpu_server(cpu_ctx) -> None:  # type: ignore[no-untyped-def]
    """A plain field (arg_groups/fields/schedule.py:31-34); its cap of the decode graph's max_bs
    (memory_hook.py:182-188) is overwritten on CPU by torch_compile_max_bs (:219-228): only it changes."""
    answer = cpu_ctx.startup("--max-running-requests", "8")
    assert answer.kind == "changed", answer
    assert answer.changed == {"max_running_requests": (2, 8)}


def test_an_invalid_choice_is_refused_with_argparses_message(cpu_ctx) -> None:  # type: ignore[no-untyped-def]
    """--attention-backend has choices (arg_groups/fields/exec_.py:207-214, choices.py:69)."""
    answer = cpu_ctx.startup("--attention-backend", "no_such_backend")
    assert answer.kind == "refused", answer
    assert "argument --attention-backend: invalid choice: 'no_such_backend'" in answer.message


def test_the_amx_backend_falls_back_on_a_host_without_amx(cpu_ctx) -> None:  # type: ignore[no-untyped-def]
    """On CPU, intel_amx falls back to torch_native unless the platform has AMX (overrides.py:1300-
    1310; has_amx is cpu_has_amx_support(), runtime_context.py:1838, common.py:366-372): no change on
    a host without AMX, a change on one with it."""
    no_amx = _ask(cpu_ctx, {**cpu_ctx.facts, "cpu.amx": False}, ["--attention-backend", "intel_amx"])
    assert no_amx.kind == "same", no_amx
    amx = _ask(cpu_ctx, {**cpu_ctx.facts, "cpu.amx": True}, ["--attention-backend", "intel_amx"])
    assert amx.kind == "changed" and amx.changed == {"attention_backend": ("torch_native", "intel_amx")}, amx


@pytest.mark.parametrize(
    ("memory_mib", "numa_nodes", "memory_max", "picked"),
    [
        (16384, 1, "max", 2048),  # < 20 GiB: memory_hook.py:88-97
        (49152, 2, "max", 4096),  # 24 GiB per NUMA node (common.py:925): 20-35 GiB, :98-113
        (65536, 1, 8 * 2**30, 2048),  # capped by the cgroup (common.py:922-924)
        (65536, 1, "max", 8192),  # 64 GiB: 60-90 GiB, :128-141
    ],
)
def test_the_chunk_size_is_picked_from_the_hosts_memory_per_numa_node(
    cpu_ctx, memory_mib: int, numa_nodes: int, memory_max: Any, picked: int
) -> None:  # type: ignore[no-untyped-def]
    host = {"cpu.memory_mib": memory_mib, "cpu.numa_nodes": numa_nodes, "cpu.memory_max": memory_max}
    answer = _ask(cpu_ctx, {**cpu_ctx.facts, **host}, ["--chunked-prefill-size", "4096"])
    assert answer.baseline["chunked_prefill_size"] == picked
    assert answer.kind == ("same" if picked == 4096 else "changed"), answer


def test_nothing_about_the_host_is_guessed(cpu_ctx) -> None:  # type: ignore[no-untyped-def]
    facts = {k: v for k, v in cpu_ctx.facts.items() if k != "cpu.numa_nodes"}
    answer = _ask(cpu_ctx, facts, ["--max-running-requests", "8"])
    assert answer.kind == "unknown" and answer.message == "not run: cpu.numa_nodes unknown"
    no_device = {k: v for k, v in cpu_ctx.facts.items() if k != "flag.device"}
    answer = _ask(cpu_ctx, no_device, ["--max-running-requests", "8"])
    assert answer.kind == "unknown" and "does not say --device cpu" in answer.message


def test_a_probe_the_sandbox_denied_is_never_sglangs_refusal(cpu_ctx) -> None:  # type: ignore[no-untyped-def]
    """`--device cpu` with neither a GPU nor a CPU host's facts: SGLang sizes from the host
    (common.py:1007-1008) and runs `lscpu` (:4459), the sandbox denies it (nothing to answer from),
    and SGLang re-raises that as its own RuntimeError (:4463): unknown, not a refusal."""
    from tools.research.startup.resolver import Resolver

    nothing = {"sm": 0, "count": 0, "memory_mib": 0, "name": ""}
    with Resolver(cpu_ctx.tree, nothing, env={"SGLANG_USE_CPU_ENGINE": "1"}) as r:
        answer = r.resolve(["--device", "cpu"], cpu_ctx.model_config_file())
    assert answer["ok"] is False and answer["kind"] == "unknown" and answer["cause"] == "denied", answer
    assert ["subprocess.Popen", "lscpu"] in answer["denied_probes"]


def test_the_units_sglang_variables_reach_sglang(cpu_ctx) -> None:  # type: ignore[no-untyped-def]
    """SGLANG_PLATFORM names a platform plugin; none is installed, so SGLang raises when it resolves
    the platform (platforms/__init__.py:108-121): the deployment itself would not start."""
    facts = {**cpu_ctx.facts, "env.SGLANG_PLATFORM": "no_such_platform"}
    answer = _ask(cpu_ctx, facts, ["--max-running-requests", "8"])
    assert answer.kind == "unknown", answer
    assert "SGLANG_PLATFORM='no_such_platform' not found in discovered platform plugins" in answer.message
