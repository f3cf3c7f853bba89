"""Fetching a version's SGLang source for `tools.research.source`: a shallow git fetch of its tag, or
its wheel by `pip download`, checked against the sha256 its index publishes, and the `sglang/`
package of the archive unpacked into the cache; `SourceError` when that fails.

Never an sdist: preparing one runs its build backend (its own code) on this machine."""

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

from tools.research.source_check import file_sha256, published_sha256, tree_digest

MARKER = "optagent-source.json"
"""The record `tools.research.source` writes beside an unpacked tree: where it came from, its digest."""
SKIPPED = frozenset({MARKER})

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


def fetch_git(version: str, dest: Path, *, repo_url: str, cache: Path, timeout: float) -> dict[str, str]:
    """Clone (bare) or fetch `repo_url`, then extract `python/sglang` at tag `v<version>`; the
    record of where it came from: `origin`, the tag's `commit` and the tree's `digest`."""
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
        commit = repo.commit(tag).hexsha
        with tempfile.TemporaryFile() as tar:
            repo.git.archive(commit, "python/sglang", format="tar", output_stream=tar)
            tar.seek(0)
            digest = _unpack(_tar_members(tar), dest, prefix="python/")
    except git.GitCommandError as e:
        detail = (e.stderr or str(e)).strip().splitlines()
        raise SourceError(f"git {repo_url} {tag}: {detail[-1] if detail else e}") from e
    return {"origin": f"git:{repo_url}@{tag}", "commit": commit, "digest": digest}


def fetch_wheel(version: str, dest: Path, *, timeout: float) -> dict[str, str]:
    """Download the wheel of `sglang==version` with pip, check it against the sha256 its index
    publishes, and unpack its sources; the record: `origin`, the wheel's `sha256`, the tree's `digest`."""
    with tempfile.TemporaryDirectory(prefix="sglang-dl-") as tmp:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, "--only-binary=:all:"]
        try:
            proc = subprocess.run(
                [*argv, f"sglang=={version}"], capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as e:
            raise SourceError(f"package index: pip download timed out after {timeout:.0f}s") from e
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise SourceError(f"package index: pip download of the wheel: {last} (an sdist is never built)")
        wheel = wheels[0]
        digest = file_sha256(wheel)
        published = published_sha256(wheel.name, timeout=min(timeout, 60.0))
        if not published:
            raise SourceError(f"package index: no index publishes a sha256 for {wheel.name}: not used")
        if digest not in published:
            raise SourceError(f"package index: {wheel.name} has sha256 {digest}, the index publishes another")
        tree = _unpack(_zip_members(wheel), dest, prefix="")
        return {"origin": f"index:{wheel.name}", "sha256": digest, "digest": tree}


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _zip_members(path: Path) -> Iterator[tuple[str, Callable[[], bytes]]]:
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            yield name, lambda n=name: zf.read(n)


def _tar_members(source: IO[bytes]) -> Iterator[tuple[str, Callable[[], bytes]]]:
    with tarfile.open(fileobj=source) as tf:
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


def _unpack(members: Iterable[tuple[str, Callable[[], bytes]]], dest: Path, *, prefix: str) -> str:
    """Write the `sglang/` package of an archive (see `_keep`; `prefix` stripped from member names)
    into `dest`, atomically, and return its `tree_digest`. A tree already there with the same
    content is kept as it is (a reader of it is not disturbed)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    count = 0
    for name, read in members:
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
    digest = tree_digest(tmp)
    if dest.is_dir() and tree_digest(dest, skip=SKIPPED) == digest:
        shutil.rmtree(tmp)
        return digest
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return digest
