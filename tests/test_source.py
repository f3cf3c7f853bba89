"""The SGLang source of an exact version: index download, git clone/fetch, cache, local trees, version."""

from __future__ import annotations

import asyncio
import filecmp
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import git
import pytest

from tools.deploy.remote import LocalTransport
from tools.research.source import detect_version, get_source, local_source
from tools.research.source_fetch import SourceError


def _same_files(a: Path, b: Path) -> bool:
    diff = filecmp.dircmp(a, b)
    if diff.left_only or diff.right_only or diff.diff_files:
        return False
    return all(_same_files(a / d, b / d) for d in diff.common_dirs)


def test_index_trees_hold_the_requested_version(sglang_0523, sglang_059, sglang_049):
    for tree, version in ((sglang_0523, "0.5.23"), (sglang_059, "0.5.9"), (sglang_049, "0.4.9")):
        assert tree.version == version
        assert "index:sglang-" + version in tree.origin
        assert (tree.package_dir / "srt" / "server_args.py").is_file()
        assert local_source(tree.root).version == version  # the tree itself says which version it is
    assert (sglang_0523.package_dir / "srt" / "arg_groups" / "fields" / "exec_.py").is_file()


def test_git_clone_checks_out_the_tag_then_the_cache_serves(sglang_git_repo, sglang_059, tmp_path):
    url = sglang_git_repo.as_uri()
    tree = get_source("0.5.9", repo_url=url, cache_dir=tmp_path)
    assert tree.origin == f"git:{url}@v0.5.9"
    assert tree.version == "0.5.9"
    assert _same_files(tree.package_dir, sglang_059.package_dir)

    moved = sglang_git_repo.with_name(sglang_git_repo.name + "-gone")
    sglang_git_repo.rename(moved)  # a second call must neither clone nor fetch
    try:
        again = get_source("v0.5.9", repo_url=url, cache_dir=tmp_path)
    finally:
        moved.rename(sglang_git_repo)
    assert again.origin.startswith("cache (git:")
    assert again.package_dir == tree.package_dir


def test_new_version_is_fetched_into_the_existing_clone(sglang_git_repo, tmp_path):
    url = sglang_git_repo.as_uri()
    get_source("0.5.9", repo_url=url, cache_dir=tmp_path)
    clone = tmp_path / "sglang-git"
    assert (clone / "HEAD").is_file()

    work = git.Repo.clone_from(url, tmp_path / "work")
    with work.config_writer() as cw:
        cw.set_value("user", "name", "t").release()
        cw.set_value("user", "email", "t@t.invalid")
    marker = Path(work.working_dir) / "python" / "sglang" / "new_in_9_9_9.py"
    marker.write_text("NEW = True\n")
    work.git.add(A=True)
    work.index.commit("next release")
    work.create_tag("v9.9.9")
    work.git.push("origin", "v9.9.9")

    tree = get_source("9.9.9", repo_url=url, cache_dir=tmp_path)
    assert tree.origin == f"git:{url}@v9.9.9"
    assert (tree.package_dir / "new_in_9_9_9.py").read_text() == "NEW = True\n"
    assert not (tmp_path / "sglang-src" / "0.5.9" / "sglang" / "new_in_9_9_9.py").exists()
    assert "v9.9.9" in {t.name for t in git.Repo(clone).tags}


def test_unreachable_git_and_index_fail_clearly_and_leave_nothing(tmp_path, monkeypatch):
    # A dead loopback index: pip must give up quickly and the error must name both sources.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_INDEX", "0")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    with pytest.raises(SourceError) as err:
        get_source("0.5.9", repo_url=(tmp_path / "no-repo").as_uri(), cache_dir=tmp_path / "cache")
    message = str(err.value)
    assert "git" in message and "package index" in message
    assert not (tmp_path / "cache" / "sglang-src" / "0.5.9").exists()
    assert not (tmp_path / "cache" / "sglang-git").exists()


def test_local_layouts_and_bad_input(sglang_git_repo, sglang_059, tmp_path):
    checkout = local_source(sglang_git_repo)
    assert checkout.package_dir == sglang_git_repo / "python" / "sglang"
    assert checkout.origin == f"local:{sglang_git_repo}"
    assert checkout.version == "0.5.9"
    assert checkout.rel(checkout.package_dir / "srt" / "server_args.py") == "python/sglang/srt/server_args.py"
    wheel = local_source(sglang_059.root)
    assert wheel.package_dir == sglang_059.package_dir
    with pytest.raises(SourceError, match="not the requested 0.5.23"):
        local_source(sglang_059.root, version="0.5.23")
    with pytest.raises(SourceError, match="no SGLang package"):
        local_source(tmp_path)
    with pytest.raises(SourceError, match="not a version"):
        get_source("0.5.9; rm -rf /", cache_dir=tmp_path)


class _InfoHandler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server API)
        body = json.dumps({"version": "0.5.23", "tp_size": 4}).encode()
        self.send_response(200 if self.path == "/get_server_info" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_detect_version_from_the_server_then_from_the_host(tmp_path, monkeypatch):
    server = HTTPServer(("127.0.0.1", 0), _InfoHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_port}"
        assert asyncio.run(detect_version(endpoint)) == "0.5.23"
    finally:
        server.shutdown()
        server.server_close()  # the port now refuses connections

    # Server down: the host's Python is asked (a real interpreter with an `sglang` on its path).
    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0.5.9"\n')
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    dead = f"http://127.0.0.1:{server.server_port}"
    version = asyncio.run(detect_version(dead, transport=LocalTransport(), python=sys.executable))
    assert version == "0.5.9"

    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "empty"))
    with pytest.raises(SourceError, match="cannot detect the SGLang version"):
        asyncio.run(detect_version(dead, transport=LocalTransport(), python=sys.executable))


def test_the_wheel_comes_first_and_git_only_without_one(tmp_path, monkeypatch):
    """The default: the released wheel (one download), a shallow git fetch only when the index
    has none; a repository the user names is what they asked for, so git goes first there."""
    import tools.research.source as source

    tried: list[str] = []

    def fail(name):  # type: ignore[no-untyped-def]
        def fetch(*args, **kwargs):  # type: ignore[no-untyped-def]
            tried.append(name)
            raise SourceError(f"{name} unavailable")

        return fetch

    monkeypatch.setattr(source, "fetch_wheel", fail("index"))
    monkeypatch.setattr(source, "fetch_git", fail("git"))
    with pytest.raises(SourceError, match="index unavailable"):
        get_source("0.5.9", cache_dir=tmp_path / "a")
    assert tried == ["index", "git"]
    tried.clear()
    with pytest.raises(SourceError):
        get_source("0.5.9", repo_url=(tmp_path / "fork").as_uri(), cache_dir=tmp_path / "b")
    assert tried == ["git", "index"]


def test_a_git_fetch_is_one_commit_deep(sglang_git_repo, tmp_path):
    get_source("0.5.9", repo_url=sglang_git_repo.as_uri(), cache_dir=tmp_path)
    clone = git.Repo(tmp_path / "sglang-git")
    assert (tmp_path / "sglang-git" / "shallow").is_file()
    assert len(list(clone.iter_commits("v0.5.9"))) == 1
