"""`optagent cache`: what optagent keeps on disk, and removing it.

Everything lives under the cache directory (`research.cache_dir`, `$OPTAGENT_CACHE_DIR` or the user
cache directory): SGLang source trees, the code index of each, the start-up venvs, the real SGLang
server's environment. Each entry is built again when next needed. Only entries optagent makes are
removed, never a path outside the cache directory, never one another optagent is filling (its lock)
or a process runs from or holds open.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import typer

from agent.cli.common import ConfigOption, confirm, console, fail, get_config
from tools.localfiles import open_append

app = typer.Typer(help=__doc__.splitlines()[0], invoke_without_command=True)

GROUPS = {
    "sglang-src": "SGLang {version} source ({origin})",
    "flag-index": "code index of SGLang {version} and its answers per deployment",
    "resolver-env": "venv for SGLang's own start-up ({transformers})",
    "resolver-models": "a model config served to SGLang's start-up",
}
"""Folders of the cache whose children are entries, and how each child is described."""
_INDEX_FILE = re.compile(r"^([^-]*-[0-9a-f]{8}-[0-9a-f]+)\.")
"""`<version>-<tree>-<digest>` of `.sqlite`, `.status-*.json` and temp files (`tools.research.index`)."""


class CacheBusyError(Exception):
    """An entry another optagent is filling, or that a process runs from or holds open."""


@dataclass(frozen=True)
class Entry:
    """One thing in the cache: `name` and its `files` relative to `root`, what it is, its size."""

    root: Path
    name: str
    files: tuple[str, ...]
    what: str
    size: int
    ours: bool
    """Made by optagent (removable); anything else in the directory is listed and left alone."""

    @property
    def lock(self) -> Path:
        """The file optagent locks while it fills this entry (`tools.research.cache.cache_lock`;
        the real server's environment keeps its lock inside)."""
        path = self.root / self.files[0]
        return path / ".lock" if self.name.startswith("real-sglang-") else path.with_name(path.name + ".lock")


def cache_roots(configured: Path | None, *, checked: bool = False) -> list[Path]:
    """The configured cache directory, and the default one when it differs (the real server's
    environment and start-up model configs always live there). `checked` (before anything is
    removed): each one there is first held to research's own rule (`trusted_cache`: writable by
    this user alone, no other user's link on the way), `UntrustedCacheError` naming it else."""
    from tools.research.cache import cache_root, trusted_cache

    roots = [cache_root(configured), cache_root()]
    if checked:
        return list(dict.fromkeys(trusted_cache(r) if os.path.lexists(r) else r.resolve() for r in roots))
    return list(dict.fromkeys(r.resolve() for r in roots))


def disk_usage(path: Path) -> int:
    """Bytes `path` takes on disk (as `du`: allocated blocks, each inode once, links not followed)."""
    try:
        total = path.lstat().st_blocks * 512
    except OSError:
        return 0
    seen: set[tuple[int, int]] = set()
    if path.is_dir() and not path.is_symlink():
        for folder, dirs, files in os.walk(path):
            for name in dirs + files:
                with contextlib.suppress(OSError):
                    s = os.lstat(os.path.join(folder, name))
                    if (s.st_dev, s.st_ino) not in seen:
                        seen.add((s.st_dev, s.st_ino))
                        total += s.st_blocks * 512
    return total


def _describe(group: str, path: Path) -> str:
    facts = {"version": "?", "origin": "?", "transformers": "unfinished"}
    with contextlib.suppress(OSError, ValueError, KeyError):
        if group == "sglang-src":
            marker = json.loads((path / "optagent-source.json").read_text())
            kind = marker["origin"].split(":", 1)[0]
            facts |= {"version": marker["version"], "origin": {"index": "its wheel"}.get(kind, kind)}
        elif group == "flag-index":
            facts["version"] = path.name.split("-", 1)[0]
        elif group == "resolver-env":
            pins = (path / ".ready").read_text().split()
            facts["transformers"] = next((p for p in pins if p.startswith("transformers")), "ready")
    return GROUPS[group].format(**facts)


def _group_entries(root: Path, group: str) -> list[Entry]:
    """The entries of one group folder: a child each, or for the index its files by index."""
    parts: dict[str, list[Path]] = {}
    for child in sorted((root / group).iterdir()):
        if child.name.endswith(".lock"):
            continue
        m = _INDEX_FILE.match(child.name) if group == "flag-index" else None
        parts.setdefault(m.group(1) if m else child.name, []).append(child)
    return [
        Entry(root, f"{group}/{key}", tuple(f"{group}/{p.name}" for p in paths), _describe(group, paths[0]),
              sum(disk_usage(p) for p in paths), True)
        for key, paths in parts.items()
    ]  # fmt: skip


def cache_entries(roots: list[Path]) -> list[Entry]:
    """Every entry under `roots` with its size, optagent's own first."""
    out = []
    for root in (r for r in roots if r.is_dir()):
        for top in sorted(root.iterdir()):
            if top.name.endswith(".lock"):
                continue
            if top.name in GROUPS and top.is_dir() and not top.is_symlink():
                out += _group_entries(root, top.name)
                continue
            if top.name.startswith("real-sglang-"):
                what, ours = "the real SGLang server's venv and tiny model (`sim up --real`)", True
            elif top.name == "sglang-git" or top.name.startswith("sglang-git-"):
                what, ours = "git repository of SGLang's release tags (the source without a wheel)", True
            else:
                what, ours = "not made by optagent: left alone", False
            out.append(Entry(root, top.name, (top.name,), what, disk_usage(top), ours))
    return sorted(out, key=lambda e: not e.ours)


def _size(n: int) -> str:
    """`n` bytes in binary units, as `du -h` counts them."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@app.callback()
def show(
    ctx: typer.Context,
    config: Path | None = ConfigOption,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List what optagent keeps on disk, with sizes (`optagent cache clean` removes entries)."""
    if ctx.invoked_subcommand is not None:
        return
    from tools.research.cache import CACHE_ENV

    configured = get_config(config).research.cache_dir
    roots = cache_roots(configured)
    entries = cache_entries(roots)
    total = sum(e.size for e in entries)
    if as_json:
        rows = [{"name": e.name, "paths": [str(e.root / f) for f in e.files], "what": e.what, "bytes": e.size,
                 "optagent": e.ours} for e in entries]  # fmt: skip
        print(json.dumps({"roots": [str(r) for r in roots], "entries": rows, "total_bytes": total}, indent=2))
        return
    from rich.table import Table

    where = (
        "research.cache_dir" if configured else f"${CACHE_ENV}" if os.environ.get(CACHE_ENV) else "default"
    )
    console.print(f"cache: {roots[0]} ({where})", highlight=False, soft_wrap=True)
    if len(roots) > 1:
        console.print(
            f"  and: {roots[1]} (the real server, start-up model configs)", highlight=False, soft_wrap=True
        )
    table = Table(box=None, show_footer=bool(entries))
    table.add_column("name", footer="total", overflow="fold")
    table.add_column("what")
    table.add_column("size", justify="right", footer=_size(total), no_wrap=True)
    for e in entries:
        table.add_row(e.name, e.what, _size(e.size))
    console.print(table if entries else "empty", highlight=False)


@app.command("clean")
def clean(
    names: list[str] = typer.Argument(
        None, help="Entries to remove: a name `optagent cache` lists, or its group."
    ),
    remove_all: bool = typer.Option(False, "--all", help="Remove every entry optagent made."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
    config: Path | None = ConfigOption,
) -> None:
    """Remove cache entries; each is built again when next needed."""
    if not names and not remove_all:
        fail("name the entries to remove (`optagent cache` lists them) or pass --all", code=2)
    from tools.research.cache import UntrustedCacheError

    try:
        roots = cache_roots(get_config(config).research.cache_dir, checked=True)
    except UntrustedCacheError as e:  # what another user can swap is not removed on their word
        fail(f"{e}; nothing was removed")
    entries = cache_entries(roots)
    chosen = [e for e in entries if e.ours] if remove_all else []
    for name in (n.rstrip("/") for n in names or []):
        match = [e for e in entries if e.name == name or e.name.startswith(name + "/")]
        if not match:
            fail(f"no cache entry {name!r}: `optagent cache` lists them", code=2)
        if not all(e.ours for e in match):
            fail(f"{name} was not made by optagent: remove it yourself if you mean to", code=2)
        chosen += [e for e in match if e not in chosen]
    if not chosen:
        console.print("nothing to remove")
        return
    for e in chosen:
        console.print(f"  {e.name}  {_size(e.size)}", highlight=False)
    if not yes:
        if not sys.stdin.isatty():
            fail("pass --yes to remove without asking", code=2)
        if not confirm(f"Remove {len(chosen)} cache entr{'y' if len(chosen) == 1 else 'ies'}?"):
            fail("not confirmed; nothing removed", code=1)
    removed, refused = [], []
    for e in chosen:
        try:
            remove_entry(e)
            removed.append(e)
        except CacheBusyError as err:
            refused.append(str(err))
    console.print(f"removed {len(removed)} of {len(chosen)}, {_size(sum(e.size for e in removed))} freed")
    if refused:
        fail("kept: " + "; ".join(refused))


@contextlib.contextmanager
def _locked(entry: Entry) -> Iterator[None]:
    """Hold the entry's lock while it is removed, so that no optagent starts filling it meanwhile;
    refuse when another holds it."""
    if not entry.lock.parent.is_dir():
        yield
        return
    try:
        f = open_append(entry.lock)  # never a lock file planted as a link or another user's file
    except OSError as e:
        raise CacheBusyError(f"{entry.name} ({e})") from None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CacheBusyError(f"{entry.name} (another optagent holds {entry.lock})") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def users_of(paths: list[Path]) -> list[int]:
    """Processes of this machine (that this user may read) running from one of `paths` or holding a
    file in it open or mapped: a real server started from the venv, a start-up worker, a run reading
    the index."""
    prefixes = tuple(str(p.resolve()) for p in paths)
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            argv = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0")]
            links = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
            maps = (proc / "maps").read_text(errors="replace")
            used = [*argv, *links, *(line.split(maxsplit=5)[-1] for line in maps.splitlines() if "/" in line)]
            if any(u == p or u.startswith(p + "/") for u in used for p in prefixes):
                found.append(int(proc.name))
    return found


def _inside(entry: Entry, name: str) -> bool:
    """`name` sits directly in the cache directory or in one of optagent's groups there (the file
    itself is not followed: a link is removed, not what it points to)."""
    if ".." in Path(name).parts or Path(name).is_absolute():
        return False
    root, parent = entry.root.resolve(), (entry.root / name).parent.resolve()
    return parent == root or (parent.parent == root and parent.name in GROUPS)


def remove_entry(entry: Entry) -> None:
    """Remove `entry` (optagent's, inside its cache directory, not in use); `CacheBusyError` else."""
    if not entry.ours or not all(_inside(entry, f) for f in entry.files):
        raise CacheBusyError(f"{entry.name} (not optagent's, or outside {entry.root})")
    paths = [entry.root / f for f in entry.files]
    with _locked(entry):
        if pids := users_of(paths):
            raise CacheBusyError(f"{entry.name} (in use by pid {', '.join(map(str, pids))})")
        for path in paths:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
