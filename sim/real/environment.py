"""What a real SGLang server needs on this machine, set up once and cached (`optagent sim up --real`).

A venv (Python 3.11) with torch 2.14.1 and torchvision 0.29.1 from the package index, the SGLang
requirements its CPU path imports (pinned as the wheel's METADATA pins them), `sglang==0.5.23
--no-deps`, and SGLang's CPU kernels (`sgl_kernel`) from a wheel whose sha256 is checked, or built
from their source. Beside it, a tiny Llama built locally by `tinymodel.py`. Each step leaves a
marker, so an interrupted set-up resumes where it stopped; a step that cannot run raises
`EnvironmentSetupError` saying what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SGLANG_VERSION = "0.5.23"
TORCH = ["torch==2.14.1", "torchvision==0.29.1"]
KERNEL_WHEEL = "sglang_kernel_cpu-0.4.5-cp311-cp311-linux_x86_64.whl"
KERNEL_SHA256 = "6650671b7f3c9f413a901830a3c1ba6ac3943e16b0c6d5929c7ff82dc7f0226f"
KERNEL_ENV = "OPTAGENT_SGL_KERNEL_CPU"
PYTHON_ENV = "OPTAGENT_REAL_PYTHON"
NEEDED_GB = 9.0
# The requirements of SGLang 0.5.23 that its CPU serving path imports (found by starting it); the
# others are CUDA kernels (flashinfer, sglang-kernel, deep-gemm, ...) or features this path never loads.
CPU_REQUIREMENTS = {
    "aiohttp", "anthropic", "blobfile", "compressed-tensors", "datasets", "distro", "easydict", "einops",
    "fastapi", "gguf", "interegular", "ipython", "llguidance", "msgspec", "ninja", "numpy", "nvidia-ml-py",
    "openai", "openai-harmony", "orjson", "outlines", "packaging", "partial-json-parser", "pillow",
    "prometheus-client", "psutil", "pybase64", "pydantic", "python-dateutil", "python-multipart", "pyzmq",
    "regex", "requests", "scipy", "sentencepiece", "setproctitle", "soundfile", "tiktoken", "tokenizers",
    "tqdm", "transformers", "uvicorn", "uvloop", "watchfiles", "xgrammar", "xxhash", "zstandard",
}  # fmt: skip
Progress = Callable[[str], None]


class EnvironmentSetupError(Exception):
    """A set-up step cannot run here; the message says which and what to do."""


@dataclass(frozen=True)
class RealEnvironment:
    """A ready venv and model: `python` runs `-m sglang.launch_server --model-path model_dir`."""

    root: Path
    python: Path
    model_dir: Path


def cache_root() -> Path:
    """`<optagent cache>/real-sglang-<version>`, the cache and this folder first held to research's
    rule (writable by this user alone, no other user's link on the way): the venv's python runs
    here. `EnvironmentSetupError` naming what is wrong else."""
    from tools.localfiles import UntrustedDirError, trusted_dir
    from tools.research.cache import MODE, trusted_cache

    try:
        return trusted_dir(
            trusted_cache() / f"real-sglang-{SGLANG_VERSION}", what="the real server's environment",
            mode=MODE, private=True,
        )  # fmt: skip
    except UntrustedDirError as e:
        raise EnvironmentSetupError(str(e)) from None


def find_python() -> str:
    """A Python 3.11 (the CPU kernels wheel and the tested torch build are for 3.11)."""
    chosen = os.environ.get(PYTHON_ENV)
    candidates = [chosen] if chosen else [sys.executable, shutil.which("python3.11") or ""]
    for exe in filter(None, candidates):
        probe = subprocess.run(
            [exe, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == "3.11":
            return exe
    raise EnvironmentSetupError(
        "a real SGLang server needs Python 3.11 with venv (its CPU kernels are built for it): install it "
        f"(apt-get install python3.11-venv, or pyenv install 3.11) or set {PYTHON_ENV} to its path"
    )


def kernel_source() -> Path:
    """The folder holding SGLang's CPU kernels: `$OPTAGENT_SGL_KERNEL_CPU`, else the workplace's copy
    beside the repository (`../shared/third_party/sgl-kernel-cpu`)."""
    if os.environ.get(KERNEL_ENV):
        return Path(os.environ[KERNEL_ENV]).expanduser().resolve()
    repo = Path(__file__).resolve().parents[2]
    for base in (repo.parent, Path.cwd().parent, Path.cwd()):
        folder = base / "shared" / "third_party" / "sgl-kernel-cpu"
        if folder.is_dir():
            return folder
    raise EnvironmentSetupError(
        f"SGLang's CPU kernels not found (PyPI has no CPU build): set {KERNEL_ENV} to a folder with "
        f"wheels/{KERNEL_WHEEL} or source/ and setup_cpu_ext.py"
    )


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class Setup:
    """The steps, each run once (a marker file in `root/steps/`), with their output in `root/setup.log`."""

    def __init__(self, root: Path, progress: Progress) -> None:
        self.root, self.say = root, progress
        self.venv, self.log = root / "venv", root / "setup.log"
        self.python = self.venv / "bin" / "python"

    def run(
        self, argv: list[str], what: str, *, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        with self.log.open("a") as log:
            log.write(f"\n$ {' '.join(argv)}\n")
            log.flush()
            done = subprocess.run(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                check=False,
            )
        if done.returncode != 0:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
            raise EnvironmentSetupError(
                f"{what} failed (exit {done.returncode}); the end of {self.log}:\n{tail}"
            )

    def step(self, name: str, text: str, action: Callable[[], None]) -> None:
        marker = self.root / "steps" / name
        if marker.exists():
            return
        self.say(text)
        action()
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("done\n")

    def pip(self, *args: str, what: str) -> None:
        self.run([str(self.python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args], what)

    def sglang_wheel(self) -> Path:
        wheels = self.root / "wheels"
        found = sorted(wheels.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
        if not found:
            self.run(
                [str(self.python), "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                 f"sglang=={SGLANG_VERSION}"],
                f"downloading the sglang {SGLANG_VERSION} wheel",
            )  # fmt: skip
            found = sorted(wheels.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
        return found[0]

    def requirements(self) -> list[str]:
        """The wheel's own pins of `CPU_REQUIREMENTS` (markers evaluated for this machine)."""
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name

        with zipfile.ZipFile(self.sglang_wheel()) as wheel:
            meta = wheel.read(f"sglang-{SGLANG_VERSION}.dist-info/METADATA").decode()
        chosen = []
        for line in meta.splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if canonicalize_name(req.name) not in CPU_REQUIREMENTS or req.url:
                continue
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                chosen.append(f"{req.name}{req.specifier}")
        return chosen

    def kernels(self) -> None:
        folder = kernel_source()
        wheel = folder / "wheels" / KERNEL_WHEEL
        if wheel.is_file():
            if sha256(wheel) != KERNEL_SHA256:
                raise EnvironmentSetupError(f"{wheel}: sha256 is not {KERNEL_SHA256}; refusing to install it")
            self.pip("--no-deps", str(wheel), what="installing SGLang's CPU kernels")
            return
        self.build_kernels(folder)

    def build_kernels(self, folder: Path) -> None:
        if not (folder / "source").is_dir() or not (folder / "setup_cpu_ext.py").is_file():
            raise EnvironmentSetupError(
                f"{folder}: neither wheels/{KERNEL_WHEEL} nor source/ with setup_cpu_ext.py"
            )
        if not Path("/usr/include/numa.h").exists():
            raise EnvironmentSetupError(
                "building SGLang's CPU kernels needs libnuma-dev: apt-get install -y libnuma-dev"
            )
        self.say("building SGLang's CPU kernels from source (~6 minutes on 2 cores)")
        build = self.root / "kernel-build"
        shutil.rmtree(build, ignore_errors=True)
        shutil.copytree(folder / "source", build)
        shutil.copy(folder / "setup_cpu_ext.py", build)
        self.run(
            [str(self.python), "setup_cpu_ext.py", "bdist_wheel", "-d", str(self.root / "wheels")],
            "building SGLang's CPU kernels",
            env={"MAX_JOBS": str(os.cpu_count() or 2)},
            cwd=build,
        )
        built = sorted((self.root / "wheels").glob("sglang_kernel_cpu-*.whl"))
        self.pip("--no-deps", str(built[-1]), what="installing the built CPU kernels")

    def check_imports(self) -> None:
        self.run(
            [
                str(self.python),
                "-c",
                "import sgl_kernel, sglang.srt.entrypoints.http_server, sglang.srt.models.llama",
            ],
            "importing SGLang's server with the CPU engine",
            env={"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1"},
        )


def _check_space(root: Path) -> None:
    free_gb = shutil.disk_usage(root).free / 1e9
    if free_gb < NEEDED_GB:
        raise EnvironmentSetupError(
            f"{root} has {free_gb:.1f} GB free; the venv needs about {NEEDED_GB:.0f} GB (torch's CUDA "
            f"libraries are most of it): free some space or set OPTAGENT_CACHE_DIR to a larger disk"
        )


def ensure_environment(
    *, root: Path | None = None, progress: Progress = lambda text: None
) -> RealEnvironment:
    """Set up (once) and return the venv and tiny model a real SGLang server runs with; a second
    caller at the same time waits for the first (a lock file beside the venv)."""
    import fcntl

    root = (root or cache_root()).resolve()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure(root, progress)


def _ensure(root: Path, progress: Progress) -> RealEnvironment:
    ready = root / "ready.json"
    model_dir = root / "models" / "tiny-llama"
    if ready.exists() and (model_dir / "model.safetensors").exists():
        return RealEnvironment(root=root, python=root / "venv" / "bin" / "python", model_dir=model_dir)
    if not (root / "venv").exists():
        _check_space(root)
    s = Setup(root, progress)
    python = find_python()
    s.step(
        "venv",
        f"creating a venv with {python}",
        lambda: s.run([python, "-m", "venv", str(s.venv)], "creating the venv"),
    )
    s.step(
        "torch",
        f"installing {' and '.join(TORCH)} (~5 GB, a few minutes)",
        lambda: s.pip(*TORCH, what="installing torch"),
    )
    s.step(
        "requirements",
        f"installing SGLang {SGLANG_VERSION}'s requirements for its CPU path",
        lambda: s.pip(*s.requirements(), *TORCH, what="installing SGLang's requirements"),
    )
    s.step(
        "sglang",
        f"installing sglang=={SGLANG_VERSION}",
        lambda: s.pip("--no-deps", str(s.sglang_wheel()), what="installing sglang"),
    )
    s.step("kernels", "installing SGLang's CPU kernels (sha256 checked)", s.kernels)
    s.step("imports", "checking that SGLang's CPU server imports", s.check_imports)
    if not (model_dir / "model.safetensors").exists():
        progress("building a tiny Llama (random weights, a tokenizer trained here)")
        shutil.rmtree(model_dir, ignore_errors=True)
        model_dir.mkdir(parents=True)
        script = Path(__file__).with_name("tinymodel.py")
        s.run([str(s.python), str(script), str(model_dir)], "building the tiny model")
    ready.write_text(json.dumps({"sglang": SGLANG_VERSION, "torch": TORCH, "kernels": KERNEL_SHA256}) + "\n")
    return RealEnvironment(root=root, python=s.python, model_dir=model_dir)


if __name__ == "__main__":  # `python -m sim.real.environment`: set up (or check) the environment, say where
    try:
        ready = ensure_environment(progress=lambda text: print(text, flush=True))
    except EnvironmentSetupError as e:
        sys.exit(f"cannot set up the real SGLang environment: {e}")
    print(f"ready: {ready.python} (model {ready.model_dir})")
