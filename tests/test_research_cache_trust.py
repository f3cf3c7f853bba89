"""The research cache is held to the run directory's rule (issue 52, item 8): what is in it runs
here (SGLang trees, in the start-up worker) or is loaded here (the flag index's pickles), so a
cache root or folder another user could write, or reach through their symlink, is refused before
research reads or writes it, naming the path and what to do, with nothing in it touched; what
research makes there is 0700.

Real directories, a second local user (made when absent; the tests run as root) and the real
entry points: `load_index`, `get_source`, the start-up worker's venv, `optagent research`."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tools.research.index as flag_index
from agent.cli.main import app
from tests.fixtures.sglang_src import synthetic_tree
from tests.test_research_index import FILES
from tools.research.index import load_index
from tools.research.source import SourceError, SourceTree, get_source
from tools.research.startup.resolver import ResolverError, worker_python


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SourceTree:
    """A small SGLang-shaped tree; each test names the cache it reads."""
    return synthetic_tree(tmp_path / "tree", monkeypatch, FILES, "9.9.9")


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _cache(tmp_path: Path, name: str, mode: int, *, folder_mode: int = 0o700) -> Path:
    """A cache root of `mode` holding a flag index folder of `folder_mode` with one file in it."""
    root = tmp_path / name
    (root / "flag-index").mkdir(parents=True)
    (root / "flag-index" / "kept.sqlite").write_text("an index built earlier\n")
    root.chmod(mode)
    (root / "flag-index").chmod(folder_mode)
    return root


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777], ids=oct)
def test_a_cache_root_others_can_write_is_refused_and_left_as_it_is(
    mode: int, tree: SourceTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group-writable, world-writable, even sticky like /tmp (another user could make `flag-index`
    first): every entry point of research refuses it before it reads or writes anything there."""
    cache = _cache(tmp_path, "cache", mode)
    monkeypatch.setenv("OPTAGENT_CACHE_DIR", str(cache))
    why = rf"the optagent cache {cache}: {cache} is writable by group or others \(mode {mode:o}\); run `chmod go-w {cache}`"
    with pytest.raises(OSError, match=why) as refused:
        load_index(tree)
    assert isinstance(refused.value, SourceError)  # research's own error too: its callers say it
    assert "set research.cache_dir (or $OPTAGENT_CACHE_DIR) to a folder of yours" in str(refused.value)
    with pytest.raises(SourceError, match=why):
        get_source("0.5.23")  # refused before any fetch
    with pytest.raises(ResolverError, match=why):
        worker_python(tree)  # the start-up check says why it did not run
    assert _files(cache) == ["flag-index", "flag-index/kept.sqlite"] and _mode(cache) == mode


def test_a_folder_of_the_cache_others_can_write_is_refused(
    tree: SourceTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _cache(tmp_path, "cache", 0o700, folder_mode=0o777)
    monkeypatch.setenv("OPTAGENT_CACHE_DIR", str(cache))
    folder = cache / "flag-index"
    with pytest.raises(OSError, match=f"the optagent cache folder {folder}: {folder} is writable by group"):
        load_index(tree)
    with pytest.raises(ResolverError, match=f"{folder} is writable by group"):
        worker_python(tree)  # any of research's folders: each holds what runs or is loaded here
    assert _files(cache) == ["flag-index", "flag-index/kept.sqlite"]


def test_a_cache_reached_through_another_users_symlink_or_owned_by_them_is_refused(
    other_user: str, tree: SourceTree, tmp_path: Path, shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other user links `<shared>/cache` to a cache of root's own: whoever may replace the link
    decides where research reads and writes. A cache root the other user owns is theirs to fill."""
    uid = pwd.getpwnam(other_user).pw_uid
    mine = _cache(tmp_path, "mine", 0o700)
    made = subprocess.run(
        ["runuser", "-u", other_user, "--", "ln", "-s", str(mine), str(shared_dir / "cache")],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    monkeypatch.setenv("OPTAGENT_CACHE_DIR", str(shared_dir / "cache"))
    with pytest.raises(OSError, match=f"the symlink {shared_dir}/cache on the way is owned by uid {uid}"):
        load_index(tree)
    theirs = _cache(tmp_path, "theirs", 0o755)
    os.chown(theirs, uid, -1)
    monkeypatch.setenv("OPTAGENT_CACHE_DIR", str(theirs))
    with pytest.raises(OSError, match=f"{theirs} is owned by uid {uid}, not by uid 0 or root"):
        load_index(tree)
    assert _files(mine) == _files(theirs) == ["flag-index", "flag-index/kept.sqlite"]


def test_the_cache_research_makes_is_private_and_one_made_before_is_used_as_it_is(
    tree: SourceTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new cache (and its missing parent, as ~/.cache) is made 0700 whatever the umask; a cache
    an earlier optagent made 0755 (nobody else can write it) is used, its modes and files kept."""
    fresh = tmp_path / "home-cache" / "optagent"
    monkeypatch.setenv("OPTAGENT_CACHE_DIR", str(fresh))
    old_umask = os.umask(0o022)
    try:
        load_index(tree)
    finally:
        os.umask(old_umask)
    assert _mode(fresh.parent) == _mode(fresh) == _mode(fresh / "flag-index") == 0o700
    assert any(p.suffix == ".sqlite" for p in (fresh / "flag-index").iterdir())
    earlier = _cache(tmp_path, "earlier", 0o755, folder_mode=0o755)
    monkeypatch.setenv("OPTAGENT_CACHE_DIR", str(earlier))
    monkeypatch.setattr(flag_index, "_LOADED", {})
    load_index(tree)
    assert _mode(earlier) == _mode(earlier / "flag-index") == 0o755
    assert "flag-index/kept.sqlite" in _files(earlier) and len(_files(earlier)) > 2


def test_optagent_research_says_what_is_wrong_with_the_cache_and_what_to_do(
    tree: SourceTree, tmp_path: Path
) -> None:
    cache = _cache(tmp_path, "cache", 0o770)
    out = CliRunner().invoke(
        app,
        ["research", "--enable-foo", "--source", str(tree.root)],
        env={"OPTAGENT_CACHE_DIR": str(cache), "COLUMNS": "400"},
    )
    assert out.exit_code == 1 and "Traceback" not in out.output, out.output
    text = " ".join(out.output.split())
    assert f"error: the optagent cache {cache}: {cache} is writable by group or others" in text, text
    assert "Nothing was read from it or written into it" in text
    assert _files(cache) == ["flag-index", "flag-index/kept.sqlite"]


def test_the_real_servers_environment_is_not_made_in_a_cache_others_can_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`optagent sim up --real` runs python from a venv in the cache: held to the same rule."""
    from sim.real.environment import EnvironmentSetupError, ensure_environment

    root = tmp_path / "open-cache"
    root.mkdir()
    root.chmod(0o777)
    monkeypatch.setenv("OPTAGENT_CACHE_DIR", str(root))
    with pytest.raises(EnvironmentSetupError, match=str(root)):
        ensure_environment()
    assert list(root.iterdir()) == []  # nothing made in it


def test_a_cache_folder_linked_elsewhere_by_its_owner_is_named_where_it_leads(tmp_path: Path) -> None:
    """A folder moved to another disk and linked back (ours, so trusted) is handed out resolved:
    the start-up worker's sandbox binds real paths, and the link would lead nowhere inside it."""
    from tools.research.cache import cache_folder

    root, elsewhere = tmp_path / "cache", tmp_path / "disk" / "models"
    root.mkdir(mode=0o700)
    elsewhere.mkdir(parents=True, mode=0o700)
    (root / "resolver-models").symlink_to(elsewhere, target_is_directory=True)
    assert cache_folder("resolver-models", root) == elsewhere.resolve()
