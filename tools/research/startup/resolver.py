"""Ask SGLang's own argument parsing and resolution what it decides at start-up.

    with Resolver(tree, hw) as r:                      # one worker per tree and hardware
        base = r.resolve(["--tp-size", "2"], model_config)
        flag = r.resolve(["--tp-size", "2", "--enable-x"], model_config)

Each answer is `{"ok": True, "args": {dest: value}, "checks": None}` (the resolved `ServerArgs`,
JSON-safe, after the checks the launch runs on it; `checks` says why those could not run here) or
`{"ok": False, "kind": "refused" | "unknown", "error": ..., "where": "sglang/...py:LINE"}`:
"refused" when SGLang itself raised or asserted (or argparse rejected the command line), "unknown"
when the failure came from the stand-ins or cannot be attributed to SGLang.

The worker (`worker/`) runs in a venv of its own per SGLang version, holding the few real packages
resolution depends on at the versions the wheel pins (transformers reads config.json into the real
config classes; msgspec, packaging, pillow, dill are used at import). torch, triton and pynvml are
fakes that answer from the hardware facts; every other missing module is a permissive stand-in.
The worker is isolated as this machine allows (`isolation.py`: bubblewrap, else `unshare -rn`,
else Landlock, else its audit hook alone; `Resolver.isolation` says which) with resource limits;
it can write only its private scratch folder, never the cache this process reads: where only the
audit hook would keep it from that (no bubblewrap, no Landlock), it is not started unless
`$OPTAGENT_RESOLVER_ISOLATION` accepts it (ResolverError saying what to install). The worker
imports SGLang once and forks per request, so one resolution's global changes never leak into
the next.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.research.cache import UntrustedCacheError, cache_folder, cache_lock
from tools.research.source import SourceTree, wheel_requirements
from tools.research.startup import isolation

REAL_PACKAGES = ("transformers", "msgspec", "packaging", "pillow", "dill")
_ONE_SPECIFIER = r"\s*(?:~=|===?|!=|<=?|>=?)\s*[A-Za-z0-9_.*+!-]+\s*"
_SPECIFIER = re.compile(rf"(?:{_ONE_SPECIFIER}(?:,{_ONE_SPECIFIER})*)?")
"""A plain PEP 440 version specifier (`>=4.57,<5`), or none: no URL, no extras, no path."""
MAX_ANSWER = 64 << 20
"""The longest answer line read from the worker (characters)."""
_BOOT = "import sys; sys.path.insert(0, {here!r}); from worker.child import main; main()"
_HERE = Path(__file__).resolve().parent


class ResolverError(RuntimeError):
    """The worker itself failed (not SGLang): no venv, a timeout, a crash, a broken protocol."""


def pinned_requirements(tree: SourceTree) -> list[str]:
    """REAL_PACKAGES with the version specifiers of the wheel's METADATA (unpinned without one).
    ResolverError for a requirement of one of them that is not a plain version specifier (a
    `name @ url`, extras, anything pip would fetch from elsewhere than the index)."""
    requires = wheel_requirements(tree)
    pyproject = tree.package_dir.parent / "pyproject.toml"  # a git checkout: python/pyproject.toml
    if not requires and pyproject.is_file():
        requires = tomllib.loads(pyproject.read_text()).get("project", {}).get("dependencies", [])
    pins: dict[str, str] = {}
    for spec in requires:
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*([^;]*)", spec)
        if not match or match.group(1).lower() not in REAL_PACKAGES:
            continue
        version = match.group(2).strip().removeprefix("(").removesuffix(")")  # old `name (>=1)`
        if not _SPECIFIER.fullmatch(version):
            raise ResolverError(f"refusing the tree's requirement {spec!r}: not a plain version specifier")
        pins.setdefault(match.group(1).lower(), version.replace(" ", ""))
    return [f"{name}{pins.get(name, '')}" for name in REAL_PACKAGES]


def pip_environment(environ: dict[str, str]) -> dict[str, str]:
    """What pip runs with when it fills the resolver's venv: the locale and pip's own settings
    (`PIP_*`), a proxy and CA bundle to reach the index, HOME for pip's config and cache; no other
    variable of this process (API keys, tokens, `PYTHON*`)."""
    keep = {"HOME", "LANG", "LC_ALL", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "NETRC"}
    proxies = {"http_proxy", "https_proxy", "no_proxy", "all_proxy"}
    env = {k: v for k, v in environ.items() if k in keep or k.lower() in proxies or k.startswith("PIP_")}
    return {**env, "PATH": "/usr/bin:/bin", "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _cache_folder(folder: str, cache_dir: Path | None = None) -> Path:
    """`cache_folder`, a cache another user could write refused as `ResolverError`: the start-up
    check then says why it did not run, and research goes on."""
    try:
        return cache_folder(folder, cache_dir)
    except UntrustedCacheError as e:
        raise ResolverError(str(e)) from e


SETUP_SECONDS = 30.0
"""A first set-up of a version's resolver venv (pip, wheels from the index): ~20-30 s measured."""


def _env_dir(requirements: list[str], cache_dir: Path | None) -> Path:
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    return _cache_folder("resolver-env", cache_dir) / key


def worker_ready(tree: SourceTree, *, cache_dir: Path | None = None) -> bool:
    """Whether this tree's resolver venv is set up already (`worker_python` then returns at once)."""
    return (_env_dir(pinned_requirements(tree), cache_dir) / ".ready").is_file()


def worker_python(
    tree: SourceTree, *, cache_dir: Path | None = None, progress: Callable[[str], None] | None = None
) -> Path:
    """The python of this tree's resolver venv, created once (~20 s, ~300 MB) under the cache;
    `progress(text)` is called once before it is created (the caller shows the wait)."""
    requirements = pinned_requirements(tree)
    env = _env_dir(requirements, cache_dir)
    python = env / "bin" / "python"
    with cache_lock(env):
        if (env / ".ready").is_file():
            return python
        shutil.rmtree(env, ignore_errors=True)
        if progress is not None:
            progress(f"setting up SGLang {tree.version}'s argument resolver (once per version)")
        steps = (
            [sys.executable, "-m", "venv", str(env)],
            [str(python), "-m", "pip", "install", "-q", "--only-binary=:all:", *requirements],
        )
        pip_env = pip_environment(dict(os.environ))
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False, env=pip_env)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["failed"]
                raise ResolverError(f"cannot set up the resolver venv ({' '.join(argv[:4])}): {tail[0]}")
        (env / ".ready").write_text("\n".join(requirements) + "\n")
    return python


class Resolver:
    """A long-lived resolver worker for one SGLang tree, one hardware (`hw`: sm, count, memory_mib,
    name; a CPU host's facts under `cpu`) and one environment (`env`: the deployment's SGLang
    variables). Not thread-safe across processes; one request at a time on its pipe."""

    def __init__(
        self,
        tree: SourceTree,
        hw: dict[str, Any],
        *,
        env: dict[str, str] | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.tree = tree
        self.timeout = timeout
        self._lock = threading.Lock()
        try:
            self.level = isolation.level()
        except ValueError as e:
            raise ResolverError(str(e)) from e
        venv = worker_python(tree).parent.parent.resolve()
        self._models = _cache_folder("resolver-models")
        self._scratch = Path(tempfile.mkdtemp(prefix="optagent-resolve-"))
        self._log = (self._scratch / "worker.log").open("w+")
        reads = isolation.read_paths(venv, tree.root, _HERE, self._models)
        prefix = {"bubblewrap": isolation.bwrap_prefix(reads), "unshare": isolation.UNSHARE_PREFIX}
        self._proc = subprocess.Popen(
            [
                *prefix.get(self.level, []),
                str(venv / "bin" / "python"),
                "-s",
                "-P",
                "-B",
                "-c",
                _BOOT.format(here=str(_HERE)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"},
            cwd=self._scratch,
        )
        hello = {
            "tree_root": str(tree.root.resolve()),
            "hw": hw,
            "env": env or {},
            "fork": True,
            "limits": isolation.limits(),
            "read": [str(p) for p in reads],
            "landlock": self.level != "hook",
        }
        self.ready = self._call(hello)
        if not self.ready.get("ready"):
            self.close()
            if self.ready.get("facts_refused"):
                raise ResolverError(f"the hardware facts are refused: {self.ready.get('error')}")
            raise ResolverError(f"SGLang {tree.version} does not import here: {self.ready.get('error')}")
        self.isolation = isolation.describe(self.level, int(self.ready.get("landlock") or 0))
        """What isolates this worker, in one line (`isolation.describe`)."""

    def resolve(
        self, argv: list[str], model_config: Path | None = None, *, watch: list[str] | None = None
    ) -> dict[str, Any]:
        """Resolve one command line; `model_config` (a config.json) is served as the model. With
        `watch` (setting names), the answer's `lines` are the tree's executed lines naming them."""
        if model_config is not None:
            argv = ["--model-path", str(self._model_dir(Path(model_config))), *argv]
        return self._call({"argv": list(argv), "watch": watch or []})

    def _model_dir(self, config: Path) -> Path:
        """A directory holding `config` as config.json, one path per content, so that answers of
        different workers compare equal (`model_path` is a resolved field)."""
        data = config.read_bytes()
        model_dir = self._models / hashlib.sha256(data).hexdigest()[:16]
        if not (model_dir / "config.json").is_file():
            model_dir.mkdir(parents=True, exist_ok=True)
            tmp = model_dir / f".config.{os.getpid()}.{threading.get_ident()}"
            tmp.write_bytes(data)
            tmp.replace(model_dir / "config.json")
        return model_dir

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin and self._proc.stdout
        with self._lock:
            try:
                self._proc.stdin.write(json.dumps(message) + "\n")
                self._proc.stdin.flush()
            except BrokenPipeError as e:
                raise ResolverError(self._exited()) from e
            with selectors.DefaultSelector() as sel:
                sel.register(self._proc.stdout, selectors.EVENT_READ)
                if not sel.select(self.timeout):
                    self._proc.kill()
                    raise ResolverError(f"the resolver worker gave no answer in {self.timeout:.0f} s")
            line = self._proc.stdout.readline(MAX_ANSWER)
        if not line:
            raise ResolverError(self._exited())
        try:
            if not line.endswith("\n"):
                raise ValueError(f"longer than {MAX_ANSWER} characters")
            answer = json.loads(line)
            if not isinstance(answer, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            self._proc.kill()
            raise ResolverError(f"the resolver worker's answer is broken: {e}") from e
        return answer

    @property
    def alive(self) -> bool:
        """Whether the worker still runs (a resource limit or a signal may have ended it)."""
        return self._proc.poll() is None

    def _exited(self) -> str:
        """Why the worker is gone: its exit code (a negative one: the signal) and its last words."""
        code = self._proc.wait()
        self._log.flush()
        self._log.seek(0)
        last = [line.strip() for line in self._log.read()[-4000:].splitlines() if line.strip()][-1:]
        return f"the resolver worker exited (code {code})" + (f": {last[0]}" if last else "")

    def close(self) -> None:
        """Stop the worker (idempotent)."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):  # a worker outliving bwrap reads its end
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._log.close()
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> Resolver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
