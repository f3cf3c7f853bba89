"""The start-up worker runs an SGLang tree's code isolated for real: at each level this machine has
(bubblewrap, `unshare -rn`, Landlock, the audit hook alone; `tools.research.startup.isolation`) a
tree whose start-up tries what a malicious one would (write into the cache the main process reads,
ctypes, `_posixsubprocess.fork_exec`, a fork, bind, connect, read a secret, raise its limits)
gets nothing, under the resource limits set; facts reach the fake `nvidia-smi` as data; the
requirement strings a wheel declares and the venv's pip are kept to plain versions from the index.

Real worker processes on the real worker venv of SGLang 0.5.23 (the tree below declares its
METADATA, so the venv is the one the other start-up tests use); the CI installs Debian's
bubblewrap."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.package_index import PackageIndex
from tests.research_profiles import DATA
from tools.research.cache import cache_root
from tools.research.source import SourceTree, local_source
from tools.research.startup import isolation
from tools.research.startup.check import startup_answer
from tools.research.startup.resolver import (
    Resolver,
    ResolverError,
    pinned_requirements,
    pip_environment,
    worker_python,
)

pytestmark = pytest.mark.slow(seconds=90)

LLAMA = DATA / "model-configs" / "meta-llama--Meta-Llama-3.1-8B_config.json"
HW = {"sm": 90, "count": 2, "memory_mib": 81559, "name": "NVIDIA H100 80GB HBM3"}

SERVER_ARGS = r'''
"""A start-up that tries what a malicious tree would; each probe's outcome is a field."""
import dataclasses
import os
import resource
import socket
import subprocess


def _try(probe):
    try:
        out = probe()
    except BaseException as e:  # every refusal is an outcome
        return f"refused: {type(e).__name__}"
    return "done" if out is None else f"done: {out}"


def _fork_exec(module, command):
    """`sh -c command` by fork_exec itself, as subprocess calls it (Python 3.11's signature)."""
    read, write = os.pipe()
    pid = module.fork_exec(
        [b"/bin/sh", b"-c", command.encode()], [b"/bin/sh"], True, (write,), None, None,
        -1, -1, -1, -1, -1, -1, read, write, True, False, -1, None, None, None, -1, None, False,
    )
    os.close(write)
    os.read(read, 64)
    os.close(read)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _fresh_posixsubprocess():
    """A second copy of _posixsubprocess, without the audit hook's guard."""
    import importlib.util

    spec = importlib.util.find_spec("_posixsubprocess")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _as_nvidia_smi(command):
    """Run `command` as the one program the audit hook lets run: the fake nvidia-smi, rewritten
    (its folder is the worker's scratch, which it may write); only the kernel stops what it does."""
    import shutil

    program = shutil.which("nvidia-smi")
    with open(program, "w") as f:
        f.write(f"#!/bin/sh\n{command}\n")
    return subprocess.run(["nvidia-smi"], capture_output=True).returncode


def _connect(port):
    socket.create_connection(("127.0.0.1", port), timeout=3).close()


def _bind():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))


def _ctypes_call():
    import ctypes

    return ctypes.CDLL(None).getpid()


def _smi():
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return repr(done.stdout)


@dataclasses.dataclass
class ServerArgs:
    tp_size: int = 1
    write_open: str = ""
    write_os_open: str = ""
    write_cache: str = ""
    ctypes_call: str = ""
    fork_exec: str = ""
    reimport: str = ""
    shell_write: str = "not tried"
    shell_write_cache: str = "not tried"
    shell_read_secret: str = "not tried"
    fork: str = ""
    bind: str = ""
    connect: str = ""
    read_secret: str = ""
    raise_limit: str = ""
    limits: str = ""
    nvidia_smi: str = ""


def prepare_server_args(argv):
    args = ServerArgs()
    if "--target" not in argv:
        return args
    target, cache, secret = (argv[argv.index(k) + 1] for k in ("--target", "--cache", "--secret"))
    port = int(argv[argv.index("--port") + 1])
    args.write_open = _try(lambda: open(os.path.join(target, "open"), "w").close())
    args.write_os_open = _try(lambda: os.close(os.open(os.path.join(target, "os_open"), os.O_WRONLY | os.O_CREAT)))
    args.write_cache = _try(lambda: open(cache, "wb").write(b"a pickle the main process would load"))
    args.ctypes_call = _try(_ctypes_call)
    import _posixsubprocess

    args.fork_exec = _try(lambda: _fork_exec(_posixsubprocess, f"echo x > {target}/fork_exec"))
    args.reimport = _try(_fresh_posixsubprocess)
    args.nvidia_smi = _try(_smi)
    if "--round-the-hook" in argv:
        args.shell_write = _try(lambda: _as_nvidia_smi(f"echo x > {target}/shell"))
        args.shell_write_cache = _try(lambda: _as_nvidia_smi(f"echo x > {cache}.sh"))
        args.shell_read_secret = _try(lambda: _as_nvidia_smi(f"read -r line < {secret}"))
    args.fork = _try(os.fork)
    args.bind = _try(_bind)
    args.connect = _try(lambda: _connect(port))
    args.read_secret = _try(lambda: open(secret).read())
    args.raise_limit = _try(lambda: resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2))
    names = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE", "RLIMIT_NPROC")
    args.limits = ",".join(f"{n}={resource.getrlimit(getattr(resource, n))[1]}" for n in names)
    return args
'''


@pytest.fixture(scope="module")
def hostile_tree(sglang_0523: SourceTree, tmp_path_factory: pytest.TempPathFactory) -> SourceTree:
    """A tree declaring 0.5.23's METADATA (its venv) whose start-up is `SERVER_ARGS`."""
    root = tmp_path_factory.mktemp("hostile") / "src"
    (root / "sglang" / "srt").mkdir(parents=True)
    (root / "sglang" / "srt" / "server_args.py").write_text(textwrap.dedent(SERVER_ARGS))
    shutil.copytree(next(sglang_0523.root.glob("sglang-*.dist-info")), root / "sglang-0.5.23.dist-info")
    return local_source(root)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback port the worker must not reach."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.5)
        yield server


def _probe(
    tree: SourceTree,
    tmp_path: Path,
    listener: socket.socket,
    hw: dict[str, Any] = HW,
    *,
    round_the_hook: bool = False,
) -> tuple[Resolver, dict[str, Any]]:
    """Start a worker on `tree`, run its probes once, stop it; what the worker wrote outside its
    scratch folder (nothing) and whether it connected (no) checked here."""
    target = tmp_path / "outside"
    target.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("a secret of this machine")
    cache = cache_root() / "flag-index" / f"planted-{uuid.uuid4().hex}.pickle"
    argv = ["--target", str(target), "--cache", str(cache), "--secret", str(secret)]
    argv += ["--port", str(listener.getsockname()[1])] + (["--round-the-hook"] if round_the_hook else [])
    resolver = Resolver(tree, hw)
    try:
        answer = resolver.resolve(argv)
    finally:
        resolver.close()
        planted = [p for p in (cache, Path(f"{cache}.sh")) if p.exists()]
        for p in planted:
            p.unlink()
    assert planted == []
    assert answer["ok"], answer
    assert list(target.iterdir()) == []
    with pytest.raises(TimeoutError):
        listener.accept()  # nothing connected
    return resolver, answer["args"]


@pytest.mark.parametrize("level", isolation.LEVELS)
def test_a_hostile_start_up_gets_nothing_at_each_level(
    level: str,
    hostile_tree: SourceTree,
    tmp_path: Path,
    listener: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(isolation.ENV, level)
    resolver, args = _probe(hostile_tree, tmp_path, listener, round_the_hook=level != "hook")
    assert resolver.level == level  # this machine has every level: none was skipped
    # what the audit hook refuses, at every level
    for probe in ("write_open", "write_os_open", "write_cache", "fork_exec", "fork", "raise_limit"):
        assert args[probe].startswith("refused: PermissionError"), (probe, args[probe])
    assert args["ctypes_call"] == "refused: PermissionError", args["ctypes_call"]
    assert args["bind"].startswith("refused") and args["connect"].startswith("refused"), args
    limits = dict(item.split("=") for item in args["limits"].split(","))
    assert {k: int(v) for k, v in limits.items() if k != "RLIMIT_NPROC"} == isolation.LIMITS
    assert 0 < int(limits["RLIMIT_NPROC"]) < 1 << 30
    assert args["nvidia_smi"] == "done: " + repr(f"{HW['name']}\n" * HW["count"])
    assert args["reimport"] == "refused: ImportError", args["reimport"]
    if level == "hook":  # the audit hook alone, as the answer says (a program it lets run is free)
        assert resolver.isolation == "the audit hook only" and args["shell_write"] == "not tried"
        return
    # a program the hook lets run, rewritten: the kernel stops what it does (sh: cannot create, exit 2)
    assert args["shell_write"] == args["shell_write_cache"] == args["shell_read_secret"] == "done: 2", args
    assert args["read_secret"].startswith(("refused: PermissionError", "refused: FileNotFoundError")), args
    landlock = isolation.landlock_abi()
    assert landlock > 0 and f"Landlock ABI {landlock}" in resolver.isolation
    assert resolver.isolation.startswith(
        {"bubblewrap": "bubblewrap +", "unshare": "unshare -rn +"}.get(level, "Landlock")
    )


def test_facts_reach_the_fake_nvidia_smi_as_data(
    hostile_tree: SourceTree, tmp_path: Path, listener: socket.socket
) -> None:
    """A GPU name holding shell syntax is printed as it is; nothing of it runs. A name that is not
    one line of printable text is refused before anything of the tree runs."""
    canary = tmp_path / "canary"
    name = f'H100"; echo ran > {canary}; : "'
    _, args = _probe(hostile_tree, tmp_path, listener, {**HW, "name": name})
    assert args["nvidia_smi"] == "done: " + repr(f"{name}\n" * HW["count"])
    assert not canary.exists()
    with pytest.raises(ResolverError, match="the hardware facts are refused: gpu.name"):
        Resolver(hostile_tree, {**HW, "name": "H100\nnvidia-smi: 2 GPUs"})
    facts = {f"gpu.{k}": v for k, v in HW.items()} | {"gpu.name": "H100\x1b[2J"}
    answer = startup_answer(
        hostile_tree, facts, ["--tp-size", "2"], base_argv=[], model_config=tmp_path / "x"
    )
    assert answer.kind == "unknown" and "refused" in answer.message


def test_the_answer_says_when_bubblewrap_did_not_isolate_it(
    hostile_tree: SourceTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"architectures": ["LlamaForCausalLM"]}')
    facts = {f"gpu.{k}": v for k, v in HW.items()}
    strong = startup_answer(hostile_tree, facts, ["--tp-size", "2"], base_argv=[], model_config=config)
    assert strong.kind == "same" and strong.note == "", strong
    monkeypatch.setenv(isolation.ENV, "hook")
    weak = startup_answer(hostile_tree, facts, ["--tp-size", "2"], base_argv=[], model_config=config)
    assert weak.kind == "same"
    assert weak.note == "SGLang's start-up ran isolated by the audit hook only (no bubblewrap here)"


def test_a_worker_free_to_write_the_cache_runs_only_when_the_user_accepts_it() -> None:
    """Without bubblewrap and Landlock nothing but the audit hook keeps the worker from writing the
    cache whose pickles this process loads: the level is refused, unless `$ENV` caps it at `unshare`
    or `hook`. Landlock (any ABI) confines writes at every level but `hook`."""
    bare = ["unshare", "hook"]  # a kernel without Landlock: what user namespaces alone give
    for cap, isolated in (
        ("", "unshare -rn + audit hook"),
        ("bubblewrap", "unshare"),
        ("landlock", "the audit hook only"),
    ):
        with pytest.raises(isolation.UnconfinedWrites, match="neither bubblewrap nor Landlock") as refused:
            isolation.choose(cap, bare, 0)
        assert f"isolated by {isolated}" in str(refused.value), refused.value
        assert "apt-get install bubblewrap" in str(refused.value)
    assert isolation.choose("unshare", bare, 0) == "unshare"
    assert isolation.choose("hook", bare, 0) == "hook"
    assert isolation.choose("", bare, 1) == "unshare"  # Landlock ABI 1 keeps its writes to scratch
    assert isolation.choose("", ["bubblewrap", "hook"], 0) == "bubblewrap"
    assert [isolation.confines_writes(lv, 0) for lv in isolation.LEVELS] == [True, False, False, False]
    assert [isolation.confines_writes(lv, 1) for lv in isolation.LEVELS] == [True, True, True, False]
    with pytest.raises(ValueError, match="one of bubblewrap"):
        isolation.choose("none", bare, 0)


def test_start_up_is_not_run_where_the_worker_could_write_the_cache(
    hostile_tree: SourceTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This machine as one with neither bubblewrap nor Landlock (a kernel without Landlock cannot be
    made here): no worker starts, the answer says why and what to do; with the level capped at the
    audit hook the same worker runs as before."""
    monkeypatch.setattr(isolation, "available", lambda: ["hook"])
    monkeypatch.setattr(isolation, "landlock_abi", lambda: 0)
    config = tmp_path / "config.json"
    config.write_text('{"architectures": ["LlamaForCausalLM"]}')
    facts = {f"gpu.{k}": v for k, v in HW.items()}
    refused = startup_answer(hostile_tree, facts, ["--tp-size", "2"], base_argv=[], model_config=config)
    assert refused.kind == "unknown" and refused.message.startswith(
        "not run: this machine has neither bubblewrap nor Landlock: SGLang's code would run isolated by "
        "the audit hook only, free to write into the optagent cache this process reads; install "
        "Debian's `bubblewrap`"
    ), refused
    with pytest.raises(ResolverError, match="neither bubblewrap nor Landlock"):
        Resolver(hostile_tree, HW)
    monkeypatch.setenv(isolation.ENV, "hook")
    accepted = startup_answer(hostile_tree, facts, ["--tp-size", "2"], base_argv=[], model_config=config)
    assert accepted.kind == "same" and "the audit hook only" in accepted.note, accepted


def _tree_requiring(tmp_path: Path, *requires: str) -> SourceTree:
    root = tmp_path / "src"
    (root / "sglang" / "srt").mkdir(parents=True)
    info = root / "sglang-9.9.9.dist-info"
    info.mkdir()
    lines = "".join(f"Requires-Dist: {r}\n" for r in requires)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: 9.9.9\n{lines}")
    return local_source(root)


def test_a_requirement_with_a_url_or_extras_is_refused(tmp_path: Path) -> None:
    plain = _tree_requiring(
        tmp_path / "a", "transformers==4.57.1", "dill>=0.3, <0.5", "torch @ https://x.invalid/t"
    )
    assert pinned_requirements(plain)[:2] == ["transformers==4.57.1", "msgspec"]
    assert "dill>=0.3,<0.5" in pinned_requirements(plain)  # torch is none of the worker's packages
    for bad in (
        "transformers @ https://example.invalid/t.whl",
        "dill[graph]==0.3.8",
        "pillow @ file:///tmp/p",
    ):
        with pytest.raises(ResolverError, match="refusing the tree's requirement"):
            pinned_requirements(_tree_requiring(tmp_path / uuid.uuid4().hex, bad))
    with pytest.raises(ResolverError, match="refusing"):
        Resolver(_tree_requiring(tmp_path / "b", "msgspec @ https://example.invalid/m.whl"), HW)


def test_the_venvs_pip_installs_wheels_only_with_pips_settings_alone(
    package_index: PackageIndex, tmp_path: Path
) -> None:
    """An index where every package is an sdist whose build backend would run here: the venv is not
    made, and nothing of an sdist ran. pip's environment keeps pip's settings, drops the rest."""
    canary = tmp_path / "canary"
    package_index.sdist_for_any(canary)
    tree = _tree_requiring(tmp_path, "transformers==1.0")
    with pytest.raises(ResolverError, match="cannot set up the resolver venv"):
        worker_python(tree, cache_dir=tmp_path / "cache")
    assert not canary.exists()
    env = pip_environment(
        {"PIP_INDEX_URL": package_index.url, "OPENAI_API_KEY": "sk-x", "HF_TOKEN": "hf_x", "HOME": "/h",
         "HTTPS_PROXY": "http://proxy:3128", "PYTHONPATH": "/evil", "LD_PRELOAD": "/evil.so"}
    )  # fmt: skip
    assert env == {
        "PIP_INDEX_URL": package_index.url,
        "HOME": "/h",
        "HTTPS_PROXY": "http://proxy:3128",
        "PATH": "/usr/bin:/bin",
        "PIP_NO_INPUT": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def _descendants(pid: int) -> set[int]:
    """`pid` and every process below it (read from /proc: PID namespaces show their outer PIDs)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
    found = {pid}
    while grown := {p for p, parent in parents.items() if parent in found} - found:
        found |= grown
    return found


@pytest.mark.parametrize("level", isolation.LEVELS)
def test_a_worker_outlives_the_thread_that_started_it_not_its_process(
    level: str, sglang_0523: SourceTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Research starts workers from a thread pool: the worker serves on once that thread has ended.
    The process that owns it killed outright (no clean-up ran): every process of the worker ends."""
    monkeypatch.setenv(isolation.ENV, level)
    started: list[Resolver] = []
    thread = threading.Thread(target=lambda: started.append(Resolver(sglang_0523, HW)))
    thread.start()
    thread.join()
    try:
        time.sleep(1)
        answer = started[0].resolve(["--tp-size", "2"], LLAMA)
        assert answer["ok"] and answer["args"]["tp_size"] == 2, answer
    finally:
        started[0].close()

    code = f"""if True:
        import sys, time
        sys.path.insert(0, {str(Path.cwd())!r})
        from tools.research.source import local_source
        from tools.research.startup.resolver import Resolver
        from pathlib import Path
        r = Resolver(local_source(Path({str(sglang_0523.root)!r})), {HW!r})
        print(r._proc.pid, flush=True)
        time.sleep(600)
    """
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        worker = _descendants(int(owner.stdout.readline()))
        assert len(worker) >= 1
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 30
    while (left := {p for p in worker if Path(f"/proc/{p}").exists()}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"worker processes left behind: {sorted(left)}"


def test_a_worker_that_died_says_how_and_the_next_question_gets_a_new_one(sglang_0523: SourceTree) -> None:
    from tools.research.startup.check import resolver_for

    first = resolver_for(sglang_0523, HW)
    for pid in _descendants(first._proc.pid):  # the worker and what isolates it, as an OOM kill would
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(ResolverError, match=r"the resolver worker exited \(code -9\)"):
        first.resolve(["--tp-size", "2"], LLAMA)
    second = resolver_for(sglang_0523, HW)
    assert second is not first and second.resolve(["--tp-size", "2"], LLAMA)["ok"]
