"""Fetching a version's SGLang source for `tools.research.source`: a shallow git fetch of its tag, or
its wheel (else sdist) by `pip download`, and the `sglang/` package of the archive unpacked into
the cache; `SourceError` when that fails."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

_BINARIES = (".so", ".pyd", ".dylib", ".dll", ".a", ".o")
# Git must fail fast when the network is down, never hang or prompt for credentials.
_GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_HTTP_LOW_SPEED_LIMIT": "1000",
    "GIT_HTTP_LOW_SPEED_TIME": "15",
    "GIT_ASKPASS": "true",
    "GCM_INTERACTIVE": "never",
}


class SourceError(Exception):
    """The source could not be found or fetched; the message says what was tried."""


def _fetch_git(version: str, dest: Path, *, repo_url: str, cache: Path, timeout: float) -> str:
    """Clone (bare) or fetch `repo_url`, then extract `python/sglang` at tag `v<version>`."""
    import git

    clone = cache / "sglang-git"
    env = {**_GIT_ENV}
    tag = f"v{version}"
    try:
        if (clone / "HEAD").exists():
            repo = git.Repo(clone)
            if tag not in {t.name for t in repo.tags}:
                repo.git.fetch(
                    "--depth=1",
                    repo_url,
                    f"+refs/tags/{tag}:refs/tags/{tag}",
                    env=env,
                    kill_after_timeout=timeout,
                )
        else:  # a bare repository holding only the tags asked for, each one commit deep
            tmp = Path(tempfile.mkdtemp(prefix="sglang-git-", dir=_ensure(cache)))
            try:
                fresh = git.Repo.init(tmp, bare=True)
                fresh.git.fetch(
                    "--depth=1",
                    repo_url,
                    f"+refs/tags/{tag}:refs/tags/{tag}",
                    env=env,
                    kill_after_timeout=timeout,
                )
            except git.GitCommandError:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            tmp.rename(clone)
            repo = git.Repo(clone)
        with tempfile.TemporaryFile() as tar:
            repo.git.archive(tag, "python/sglang", format="tar", output_stream=tar)
            tar.seek(0)
            _unpack(_tar_members(tar), dest, prefix="python/")
    except git.GitCommandError as e:
        detail = (e.stderr or str(e)).strip().splitlines()
        raise SourceError(f"git {repo_url} {tag}: {detail[-1] if detail else e}") from e
    return f"git:{repo_url}@{tag}"


def _fetch_index(version: str, dest: Path, *, timeout: float) -> str:
    """Download the wheel (else the sdist) of `sglang==version` with pip and unpack its sources."""
    with tempfile.TemporaryDirectory(prefix="sglang-dl-") as tmp:
        base = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp]
        errors = []
        for mode in ("--only-binary=:all:", "--no-binary=:all:"):
            try:
                proc = subprocess.run(
                    [*base, mode, f"sglang=={version}"], capture_output=True, text=True, timeout=timeout
                )
            except subprocess.TimeoutExpired:
                errors.append(f"pip download {mode} timed out after {timeout:.0f}s")
                continue
            files = sorted(Path(tmp).iterdir())
            if proc.returncode == 0 and files:
                archive = files[0]
                if archive.suffix == ".whl":
                    _unpack(_zip_members(archive), dest, prefix="")
                else:
                    _unpack(_tar_members(archive), dest, prefix=None)
                return f"index:{archive.name}"
            errors.append(f"pip download {mode}: {(proc.stderr.strip().splitlines() or ['failed'])[-1]}")
        raise SourceError("package index: " + "; ".join(errors))


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _zip_members(path: Path) -> Iterator[tuple[str, Callable[[], bytes]]]:
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            yield name, lambda n=name: zf.read(n)


def _tar_members(source: Path | IO[bytes]) -> Iterator[tuple[str, Callable[[], bytes]]]:
    kwargs = {"name": source} if isinstance(source, Path) else {"fileobj": source}
    with tarfile.open(**kwargs) as tf:
        for member in tf:
            if member.isfile():
                yield member.name, lambda m=member: tf.extractfile(m).read()


def _keep(rel: str) -> bool:
    """What a tree keeps of an archive: the `sglang/` package without compiled binaries (the sources,
    headers and data files its own code looks for at import: SGLang's start-up runs on this tree,
    `tools.research.startup`) and the wheel's METADATA (its pinned dependencies)."""
    parts = rel.split("/")
    if ".." in parts or not parts[-1]:
        return False
    if len(parts) == 2 and parts[0].startswith("sglang-") and parts[0].endswith(".dist-info"):
        return parts[1] == "METADATA"
    return parts[0] == "sglang" and not rel.endswith(_BINARIES)


def _unpack(members: Iterable[tuple[str, Callable[[], bytes]]], dest: Path, *, prefix: str | None) -> None:
    """Write the `sglang/` package of an archive (see `_keep`) into `dest`, atomically.

    `prefix` is stripped from member names; None finds `sglang/` at any depth (sdists).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    count = 0
    for name, read in members:
        if prefix is None:
            idx = name.find("/sglang/")
            rel = name[idx + 1 :] if idx >= 0 else ""
        else:
            rel = name.removeprefix(prefix)
        if not _keep(rel):
            continue
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(read())
        count += 1
    if count == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SourceError("the archive holds no sglang/ Python sources")
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
