"""The SGLang source of the exact running version: detected, fetched once, cached.

Where the code comes from, in order: a local directory the user names (a git checkout with
`python/sglang/`, or an unpacked wheel with `sglang/`); the cache; a gitpython clone (or fetch) of
the repository and `git archive` of the tag `v<version>`; the wheel of that version from
the package index pip is configured for. `SourceTree.version` and `.origin` say what was used.

A cached tree is served only while its content has the digest recorded when it was unpacked (a
wheel is unpacked only when its sha256 is the one its index publishes): a tree changed since is
fetched again. Fetching (git, the package index) and unpacking are in `source_fetch.py`, the
checks in `source_check.py`; the cache itself, checked before it is used, in `cache.py`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.research.cache import cache_folder, cache_lock, trusted_cache
from tools.research.source_check import tree_digest
from tools.research.source_fetch import MARKER as _MARKER
from tools.research.source_fetch import SKIPPED, SourceError, fetch_git, fetch_wheel

DEFAULT_REPO_URL = "https://github.com/sgl-project/sglang.git"
_LAYOUT = 3
"""Trees unpacked by an older layout (Python files only; no digest) are fetched again."""
_VERIFIED: dict[Path, int] = {}
"""Cached trees whose digest this process checked, with their record's mtime then."""
_VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")


@dataclass(frozen=True)
class SourceTree:
    """A readable SGLang source tree: `package_dir` is the `sglang/` package inside `root`."""

    root: Path
    package_dir: Path
    version: str
    origin: str

    def rel(self, path: Path) -> str:
        """`path` relative to the tree root, with forward slashes, for `path:line` citations."""
        return Path(path).resolve().relative_to(self.root.resolve()).as_posix()


def _check_version(version: str) -> str:
    version = version.strip().removeprefix("v")
    if not _VERSION_RE.match(version):
        raise SourceError(f"not a version: {version!r}")
    return version


def get_source(
    version: str | None,
    *,
    repo_url: str = DEFAULT_REPO_URL,
    cache_dir: Path | None = None,
    source_dir: Path | None = None,
    git_timeout: float = 120.0,
    pip_timeout: float = 300.0,
    progress: Callable[[str], None] | None = None,
) -> SourceTree:
    """The source of SGLang `version`: from `source_dir`, else the cache, else the index, else git.
    `progress(text)` is called once before a fetch (tens of seconds; the caller shows it)."""
    if source_dir is not None:
        return local_source(Path(source_dir), version=version)
    if not version:
        raise SourceError("no SGLang version given and no source directory")
    version = _check_version(version)
    dest = cache_folder("sglang-src", cache_dir) / version  # the cache checked first: its trees run here
    with cache_lock(dest):
        tree = _cached(dest)
        if tree is None and progress is not None:
            progress(f"fetching the source of SGLang {version} (once per version)")
        return tree or _fetch(version, dest, repo_url, trusted_cache(cache_dir), git_timeout, pip_timeout)


def _fetch(
    version: str, dest: Path, repo_url: str, cache: Path, git_timeout: float, pip_timeout: float
) -> SourceTree:
    """Fetch `version` into `dest`: its wheel from the package index first (one download, the exact
    released files), else a shallow git fetch of its tag; a repository other than the default is
    what the user asked for, so it goes first."""
    fetchers = [
        lambda: fetch_wheel(version, dest, timeout=pip_timeout),
        lambda: fetch_git(version, dest, repo_url=repo_url, cache=cache, timeout=git_timeout),
    ]
    if repo_url != DEFAULT_REPO_URL:
        fetchers.reverse()
    errors = []
    for fetch in fetchers:
        try:
            record = fetch()
            break
        except SourceError as e:
            errors.append(str(e))
    else:
        raise SourceError(f"cannot get the source of sglang {version}:\n  " + "\n  ".join(errors))
    tmp = dest / f".{_MARKER}.{os.getpid()}"
    tmp.write_text(json.dumps({"version": version, **record, "layout": _LAYOUT}))
    tmp.replace(dest / _MARKER)
    _VERIFIED[dest] = (dest / _MARKER).stat().st_mtime_ns
    return SourceTree(dest, dest / "sglang", version, record["origin"])


def _cached(dest: Path) -> SourceTree | None:
    """The tree cached at `dest` when its content still has the digest its record gives."""
    marker = dest / _MARKER
    if not marker.is_file() or not (dest / "sglang").is_dir():
        return None
    try:
        data = json.loads(marker.read_text())
    except ValueError:
        return None
    if data.get("layout") != _LAYOUT or not isinstance(data.get("digest"), str):
        return None
    stamp = marker.stat().st_mtime_ns
    if _VERIFIED.get(dest) != stamp:
        if tree_digest(dest, skip=SKIPPED) != data["digest"]:
            return None
        _VERIFIED[dest] = stamp
    return SourceTree(dest, dest / "sglang", data["version"], f"cache ({data['origin']})")


def wheel_requirements(tree: SourceTree) -> list[str]:
    """The `Requires-Dist:` lines of the tree's wheel METADATA (markers included), [] without one."""
    return [
        line.removeprefix("Requires-Dist:").strip()
        for metadata in tree.root.glob("sglang-*.dist-info/METADATA")
        for line in metadata.read_text(errors="replace").splitlines()
        if line.startswith("Requires-Dist:")
    ]


def local_source(path: Path, *, version: str | None = None) -> SourceTree:
    """A tree the user gave: a git checkout (`python/sglang`), an unpacked wheel (`sglang/`) or the package."""
    path = path.expanduser().resolve()
    for root, package in ((path, path / "python" / "sglang"), (path, path / "sglang"), (path.parent, path)):
        if (package / "srt").is_dir():
            found = tree_version(package)
            if found and version and _check_version(version) != found:
                raise SourceError(f"{path} holds sglang {found}, not the requested {version}")
            return SourceTree(root, package, found or version or "unknown", f"local:{path}")
    raise SourceError(f"{path}: no SGLang package here (looked for python/sglang/srt, sglang/srt, srt/)")


def tree_version(package_dir: Path) -> str | None:
    """The version a tree declares: `_version.py` (0.5.x), `version.py` (0.4.x and older), a
    `.dist-info` beside it, or `pyproject.toml`."""
    for name in ("_version.py", "version.py"):
        version_file = package_dir / name
        if version_file.is_file():
            m = re.search(r"__version__\s*=.*?['\"]([^'\"]+)['\"]", version_file.read_text())
            if m:
                return m.group(1)
    for info in sorted(package_dir.parent.glob("sglang-*.dist-info")):
        return info.name.removeprefix("sglang-").removesuffix(".dist-info")
    pyproject = package_dir.parent / "pyproject.toml"
    if pyproject.is_file():
        m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
        if m:
            return m.group(1)
    return None


async def detect_version(endpoint: str | None, *, transport: Any = None, python: str = "python3") -> str:
    """The server's SGLang version: `/get_server_info`, else `sglang.__version__` / `pip show` on the host."""
    import httpx

    tried: list[str] = []
    if endpoint:
        try:
            from tools.auth import auth_headers  # a server started with --api-key answers 401 without it

            async with httpx.AsyncClient(timeout=10.0, headers=auth_headers()) as client:
                resp = await client.get(f"{endpoint.rstrip('/')}/get_server_info")
            if resp.status_code == 200 and isinstance(resp.json().get("version"), str):
                return _check_version(resp.json()["version"])
            tried.append(f"{endpoint}/get_server_info: HTTP {resp.status_code}, no version")
        except (httpx.HTTPError, ValueError) as e:
            tried.append(f"{endpoint}/get_server_info: {e}")
    if transport is not None:
        probes = (
            ([python, "-c", "import sglang; print(sglang.__version__)"], r"([0-9][^\s]*)\s*\Z"),
            ([python, "-m", "pip", "show", "sglang"], r"^Version:\s*(\S+)"),
        )
        for argv, pattern in probes:
            result = await transport.run(argv, timeout=60)
            m = re.search(pattern, result.stdout, re.MULTILINE)
            if result.returncode == 0 and m:
                return _check_version(m.group(1))
            tried.append(f"{' '.join(argv[:3])}: exit {result.returncode} {result.stderr.strip()[-200:]}")
    raise SourceError("cannot detect the SGLang version: " + "; ".join(tried or ["nothing to ask"]))
