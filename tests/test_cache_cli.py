"""`optagent cache` and `optagent cache clean` (issue 51, item 9) on a cache directory laid out as
optagent lays it out (`$OPTAGENT_CACHE_DIR` in a temporary directory): sizes per entry and in
total; removal by name, by group or all, asked on a terminal; never what optagent did not make,
never past a link out of the cache, never an entry another optagent is filling or a process uses."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_deploy import OPTAGENT
from tests.test_prompt_on_screen import _read

INDEX = "0.5.23-032aa26a-ecc530af01f41950"
RESOLVER = "4323011a3daf"


def _file(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """A cache as optagent fills it (files of known size), a lock file beside each filled entry,
    and a folder optagent did not make."""
    root = tmp_path / "cache"
    src = root / "sglang-src" / "0.5.23"
    _file(src / "sglang" / "srt" / "server_args.py", 300_000)
    (src / "optagent-source.json").write_text(
        json.dumps({"version": "0.5.23", "origin": "index:x.whl", "layout": 2})
    )
    _file(root / "flag-index" / f"{INDEX}.sqlite", 500_000)
    _file(root / "flag-index" / f"{INDEX}.status-04185bd1b0d95703.pickle", 20_000)
    _file(root / "resolver-env" / RESOLVER / "lib" / "site.py", 200_000)
    (root / "resolver-env" / RESOLVER / ".ready").write_text("transformers==5.19.0\n")
    _file(root / "real-sglang-0.5.23" / "venv" / "lib" / "torch.so", 2 << 20)
    (root / "real-sglang-0.5.23" / ".lock").touch()
    for lock in (
        "sglang-src/0.5.23.lock",
        f"flag-index/{INDEX}.sqlite.lock",
        f"resolver-env/{RESOLVER}.lock",
    ):
        (root / lock).touch()
    _file(root / "someone-elses" / "notes.txt", 10_000)
    return root


def _cli(*args: str, cache: Path, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPTAGENT_CACHE_DIR": str(cache), "COLUMNS": "160"}
    extra = ["--config", str(config)] if config else []
    return subprocess.run([OPTAGENT, "cache", *args, *extra], capture_output=True, text=True, env=env,
                          timeout=60, cwd=cache.parent)  # fmt: skip


def _listing(cache: Path) -> dict[str, dict[str, object]]:
    done = _cli("--json", cache=cache)
    assert done.returncode == 0, done.stderr
    return {e["name"]: e for e in json.loads(done.stdout)["entries"]}


def test_the_listing_gives_each_entry_its_size_and_the_total(cache: Path) -> None:
    done = _cli("--json", cache=cache)
    data = json.loads(done.stdout)
    entries = {e["name"]: e for e in data["entries"]}
    assert data["roots"] == [str(cache.resolve())]
    assert set(entries) == {"sglang-src/0.5.23", f"flag-index/{INDEX}", f"resolver-env/{RESOLVER}",
                            "real-sglang-0.5.23", "someone-elses"}  # fmt: skip
    written = {"sglang-src/0.5.23": 300_000, f"flag-index/{INDEX}": 520_000, f"resolver-env/{RESOLVER}": 200_000,
               "real-sglang-0.5.23": 2 << 20, "someone-elses": 10_000}  # fmt: skip
    for name, size in written.items():  # on disk: the bytes written, rounded up to blocks, plus folders
        assert size <= entries[name]["bytes"] < size + 64_000, (name, entries[name]["bytes"])
    assert data["total_bytes"] == sum(e["bytes"] for e in entries.values())
    assert entries["someone-elses"]["optagent"] is False and entries["sglang-src/0.5.23"]["optagent"] is True
    assert "transformers==5.19.0" in entries[f"resolver-env/{RESOLVER}"]["what"]

    table = _cli(cache=cache).stdout
    assert f"cache: {cache.resolve()} ($OPTAGENT_CACHE_DIR)" in table
    assert (
        "real-sglang-0.5.23" in table and "2.0 MiB" in table and "SGLang 0.5.23 source (its wheel)" in table
    )
    assert "total" in table and f"{data['total_bytes'] / (1 << 20):.1f} MiB" in table


def test_research_cache_dir_in_the_config_is_listed_beside_the_default(cache: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    _file(other / "sglang-src" / "0.5.22" / "sglang" / "x.py", 5_000)
    config = tmp_path / "optagent.toml"
    config.write_text(f'[research]\ncache_dir = "{other}"\n')
    data = json.loads(_cli("--json", cache=cache, config=config).stdout)
    assert data["roots"] == [str(other.resolve()), str(cache.resolve())]
    assert {"sglang-src/0.5.22", "real-sglang-0.5.23"} <= {e["name"] for e in data["entries"]}


def test_clean_removes_what_is_named_and_leaves_the_rest(cache: Path) -> None:
    done = _cli("clean", "flag-index", f"resolver-env/{RESOLVER}/", "--yes", cache=cache)
    assert done.returncode == 0, done.stderr
    assert "removed 2 of 2" in done.stdout
    assert sorted(p.name for p in (cache / "flag-index").iterdir()) == [
        f"{INDEX}.sqlite.lock"
    ]  # the lock stays
    assert not (cache / "resolver-env" / RESOLVER).exists()
    assert set(_listing(cache)) == {"sglang-src/0.5.23", "real-sglang-0.5.23", "someone-elses"}


def test_clean_all_removes_only_optagents_entries(cache: Path) -> None:
    done = _cli("clean", "--all", "--yes", cache=cache)
    assert done.returncode == 0 and "removed 4 of 4" in done.stdout, done.stdout + done.stderr
    assert set(_listing(cache)) == {"someone-elses"} and (cache / "someone-elses" / "notes.txt").exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["clean", "someone-elses", "--yes"], "was not made by optagent"),
        (["clean", "../cache", "--yes"], "no cache entry '../cache'"),
        (["clean", "/etc", "--yes"], "no cache entry '/etc'"),
        (["clean"], "or pass --all"),
        (["clean", "--all"], "pass --yes"),  # no terminal to ask on
    ],
)
def test_clean_refuses_without_removing_anything(cache: Path, args: list[str], said: str) -> None:
    before = _listing(cache)
    done = _cli(*args, cache=cache)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert _listing(cache) == before


def test_a_link_out_of_the_cache_is_removed_not_followed(cache: Path, tmp_path: Path) -> None:
    outside = _file(tmp_path / "precious" / "data.bin", 1_000)
    (cache / "resolver-env" / "linked").symlink_to(outside.parent, target_is_directory=True)
    done = _cli("clean", "resolver-env", "--yes", cache=cache)
    assert done.returncode == 0, done.stderr
    assert not (cache / "resolver-env" / "linked").is_symlink() and outside.exists()


def test_an_entry_another_optagent_is_filling_is_kept(cache: Path) -> None:
    with open(cache / "sglang-src" / "0.5.23.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as `cache_lock` holds it while a fetch runs
        done = _cli("clean", "--all", "--yes", cache=cache)
    assert done.returncode == 1 and "removed 3 of 4" in done.stdout, done.stdout + done.stderr
    assert "sglang-src/0.5.23 (another optagent holds" in done.stderr
    assert set(_listing(cache)) == {"sglang-src/0.5.23", "someone-elses"}


def test_an_entry_a_process_holds_open_is_kept(cache: Path) -> None:
    venv_file = cache / "real-sglang-0.5.23" / "venv" / "lib" / "torch.so"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"f = open({str(venv_file)!r}, 'rb'); print('open', flush=True); input()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        done = _cli("clean", "real-sglang-0.5.23", "--yes", cache=cache)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 1 and f"in use by pid {holder.pid}" in done.stderr, done.stderr
    assert venv_file.exists()
    assert _cli("clean", "real-sglang-0.5.23", "--yes", cache=cache).returncode == 0  # once it is closed
    assert not (cache / "real-sglang-0.5.23").exists()


@pytest.mark.parametrize(("answer", "kept"), [(b"n\n", True), (b"y\n", False)])
def test_clean_asks_on_a_terminal(cache: Path, answer: bytes, kept: bool) -> None:
    master, slave = os.openpty()
    proc = subprocess.Popen([OPTAGENT, "cache", "clean", "sglang-src"], stdin=slave, stdout=slave, stderr=slave,
                            env={**os.environ, "OPTAGENT_CACHE_DIR": str(cache), "COLUMNS": "100"},
                            cwd=cache.parent, close_fds=True)  # fmt: skip
    os.close(slave)
    try:
        seen, deadline = b"", time.monotonic() + 30
        while b"Remove 1 cache entry?" not in seen and time.monotonic() < deadline:
            seen += _read(master, 0.5)
        assert b"sglang-src/0.5.23" in seen and b"Remove 1 cache entry? [y/N]:" in seen, seen
        os.write(master, answer)
        proc.wait(timeout=30)
        seen += _read(master, 0.5)
    finally:
        proc.kill()
        os.close(master)
    assert (cache / "sglang-src" / "0.5.23").exists() is kept, seen
    assert proc.returncode == (1 if kept else 0), seen


def test_the_readme_names_every_kind_of_entry_the_cache_command_lists() -> None:
    """README's "What it keeps on disk" has a row, with a size, for each folder `optagent cache`
    lists entries of, named as the command names them, and for the real server's environment."""
    import re

    from agent.cli.cache import GROUPS

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## What it keeps on disk", 1)[1].split("\n## ", 1)[0]
    rows = {m[1]: line for line in section.splitlines() if (m := re.match(r"\| `([\w.-]+?)[/`<]", line))}
    assert set(GROUPS) <= set(rows) and any(n.startswith("real-sglang-") for n in rows), sorted(rows)
    unsized = [name for name, line in rows.items() if not re.search(r"\d+(\.\d+)? [KMG]iB", line)]
    assert unsized == [], unsized


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770], ids=oct)
def test_clean_refuses_a_cache_another_user_could_write(cache: Path, mode: int) -> None:
    """A cache others can write is held to research's rule before anything in it is removed: they
    could have swapped an entry for a link, or planted what `clean` would trust as optagent's."""
    cache.chmod(mode)
    before = _listing(cache)  # listing reads only
    done = _cli("clean", "--all", "--yes", cache=cache)
    said = " ".join(done.stderr.split())
    assert done.returncode == 1, said
    assert str(cache) in said and "nothing was removed" in said, said
    cache.chmod(0o700)
    assert _listing(cache) == before
