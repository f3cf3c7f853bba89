"""The optagent cache: where research keeps what it fetched, built and set up once, checked first.

The cache (`research.cache_dir`, `$OPTAGENT_CACHE_DIR`, else the user cache directory,
~/.cache/optagent) holds SGLang trees (`sglang-src/`, `sglang-git`), their code indexes
(`flag-index/`, SQLite of pickled records this process loads), the start-up worker's venvs
(`resolver-env/`) and the model configs served to it (`resolver-models/`). What is in it runs here
or is loaded here, so whoever can write into it can run code as the user: before research reads or
writes it, the cache root and each of those folders in it are held to the run directory's rule
(`tools.localfiles.trusted_dir`): owned by this user or root, writable by nobody else (not even
sticky, as /tmp is: another user could make a folder's name first), and every symlink on the way
owned by this user or root in a directory nobody else can write. What research makes there is
made 0700. A cache that fails is refused (`UntrustedCacheError`, naming the path and what to do);
nothing in it is read, changed or removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from tools.localfiles import UntrustedDirError, trusted_dir
from tools.research.source_fetch import SourceError

CACHE_ENV = "OPTAGENT_CACHE_DIR"
FOLDERS = ("sglang-src", "sglang-git", "flag-index", "resolver-env", "resolver-models")
"""What research keeps in the cache, each checked with the root."""
MODE = 0o700


class UntrustedCacheError(SourceError, UntrustedDirError):
    """The cache, or a folder research keeps in it, is one another user could write or swap.
    A `SourceError` (research's own failures) and an `OSError` (a directory's), for the callers of
    either."""


def cache_root(cache_dir: Path | None = None) -> Path:
    """Where the optagent cache is: `cache_dir`, `$OPTAGENT_CACHE_DIR` or the user cache dir
    (the path only, unchecked: `trusted_cache` before anything is read or written there)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("optagent"))


def trusted_cache(cache_dir: Path | None = None) -> Path:
    """The cache root, resolved and made (0700) when missing, after checking it and each of
    `FOLDERS` that is there (see the module docstring); `UntrustedCacheError` otherwise."""
    root = cache_root(cache_dir)
    try:
        real = trusted_dir(root, what="the optagent cache", mode=MODE, private=True)
        for folder in FOLDERS:
            if os.path.lexists(real / folder):
                trusted_dir(real / folder, what="the optagent cache folder", create=False, private=True)
    except UntrustedDirError as e:
        raise UntrustedCacheError(
            f"{e}. Research runs and loads what is in its cache: make it writable by "
            f"you alone, or set research.cache_dir (or ${CACHE_ENV}) to a folder of yours. Nothing "
            "was read from it or written into it",
        ) from None
    except NotADirectoryError as e:
        raise UntrustedCacheError(f"{e.strerror}: the optagent cache must be made of folders") from None
    return real


def cache_folder(folder: str, cache_dir: Path | None = None) -> Path:
    """`<trusted cache>/<folder>` (one of `FOLDERS`), made 0700 when missing, resolved: a folder that
    is a link of this user's (checked with the root) is named by where it leads, the path the
    start-up worker's sandbox binds and confines (a link inside it would lead nowhere there)."""
    path = trusted_cache(cache_dir) / folder
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=MODE)
    return path.resolve()


@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `<path>.lock` while a cache entry is checked and filled, so that two
    processes (two optagent commands, parallel test workers) never fetch or build the same entry at
    once; the second waits and then finds it done."""
    path.parent.mkdir(mode=MODE, parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
