"""What a fetched SGLang source is checked against: a wheel is used only with the sha256 its index
publishes, an sdist is never built, and a cached tree is served only while its content is what was
unpacked. Real pip against a package index on loopback."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tools.research.source import get_source
from tools.research.source_check import tree_digest
from tools.research.source_fetch import SKIPPED, SourceError

VERSION = "9.9.9"
WHEEL = f"sglang-{VERSION}-py3-none-any.whl"
SDIST = f"sglang-{VERSION}.tar.gz"
NO_GIT = "file:///nonexistent/optagent-test/sglang.git"


def _wheel() -> bytes:
    buf = io.BytesIO()
    info = f"sglang-{VERSION}.dist-info"
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("sglang/__init__.py", f'__version__ = "{VERSION}"\n')
        zf.writestr("sglang/srt/server_args.py", "class ServerArgs:\n    pass\n")
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: sglang\nVersion: {VERSION}\n")
        zf.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{info}/RECORD", "")
    return buf.getvalue()


def _sdist(canary: Path) -> bytes:
    """An sdist whose in-tree build backend (no requirements to install) writes `canary` when
    pip asks it anything: what building it on this machine would run."""
    backend = (
        "import pathlib\n"
        f"pathlib.Path({str(canary)!r}).write_text('the sdist ran here')\n"
        "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
        "def prepare_metadata_for_build_wheel(d, config_settings=None):\n    raise SystemExit(1)\n"
    )
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "backend.py": backend,
        "PKG-INFO": f"Metadata-Version: 2.1\nName: sglang\nVersion: {VERSION}\n",
        "sglang/__init__.py": "",
        "sglang/srt/server_args.py": "",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(f"sglang-{VERSION}/{name}")
            member.size = len(data)
            tf.addfile(member, io.BytesIO(data))
    return buf.getvalue()


class _Index:
    """A PEP 503 index on loopback: `files` (name -> bytes) listed with `published` (name -> the
    `#sha256=` fragment its link carries, None for none); `downloads` counts file requests."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.published: dict[str, str | None] = {}
        self.downloads = 0
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.rstrip("/") == "/simple/sglang":
                    links = "".join(
                        f'<a href="/files/{name}{"#sha256=" + h if (h := index.published.get(name)) else ""}">{name}</a>'
                        for name in index.files
                    )
                    self._send(200, f"<html><body>{links}</body></html>".encode(), "text/html")
                elif self.path.startswith("/files/") and self.path[7:] in index.files:
                    index.downloads += 1
                    self._send(200, index.files[self.path[7:]], "application/octet-stream")
                else:
                    self._send(404, b"", "text/plain")

            def _send(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/simple"

    def publish(self, name: str, data: bytes, sha256: str | None) -> None:
        self.files[name] = data
        self.published[name] = sha256


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Index]:
    """The loopback index, and pip pointed at it alone (no config files, no cache, no find-links)."""
    idx = _Index()
    thread = threading.Thread(target=idx.server.serve_forever, daemon=True)
    thread.start()
    for name, value in {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": idx.url,
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "5",
    }.items():
        monkeypatch.setenv(name, value)
    yield idx
    idx.server.shutdown()
    idx.server.server_close()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_wheel_is_used_with_the_sha256_its_index_publishes_and_recorded(
    index: _Index, tmp_path: Path
) -> None:
    wheel = _wheel()
    index.publish(WHEEL, wheel, _sha(wheel))
    tree = get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path)
    assert tree.origin == f"index:{WHEEL}"
    record = json.loads((tree.root / "optagent-source.json").read_text())
    assert record["sha256"] == _sha(wheel)
    assert record["digest"] == tree_digest(tree.root, skip=SKIPPED)
    assert (tree.package_dir / "srt" / "server_args.py").read_text() == "class ServerArgs:\n    pass\n"


def test_a_wheel_its_index_publishes_no_sha256_for_is_not_used(index: _Index, tmp_path: Path) -> None:
    wheel = _wheel()
    index.publish(WHEEL, wheel, None)
    with pytest.raises(SourceError, match=f"no index publishes a sha256 for {WHEEL}"):
        get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path)
    assert index.downloads == 1  # pip did download it: the refusal is ours
    assert not (tmp_path / "sglang-src" / VERSION).exists()


def test_a_wheel_with_another_sha256_than_published_is_not_used(index: _Index, tmp_path: Path) -> None:
    index.publish(WHEEL, _wheel(), _sha(b"another wheel"))
    with pytest.raises(SourceError, match="package index"):
        get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path)
    assert not (tmp_path / "sglang-src" / VERSION).exists()


def test_an_sdist_is_never_built_on_this_machine(index: _Index, tmp_path: Path) -> None:
    """An index with only an sdist: its build backend would run to prepare it; the index fails as
    having no wheel, and nothing of the sdist ran."""
    canary = tmp_path / "canary"
    sdist = _sdist(canary)
    index.publish(SDIST, sdist, _sha(sdist))
    with pytest.raises(SourceError) as err:
        get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path / "cache")
    assert not canary.exists()
    assert "an sdist is never built" in str(err.value)
    assert not (tmp_path / "cache" / "sglang-src" / VERSION).exists()


def test_a_cached_tree_changed_since_it_was_unpacked_is_fetched_again(index: _Index, tmp_path: Path) -> None:
    wheel = _wheel()
    index.publish(WHEEL, wheel, _sha(wheel))
    tree = get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path)
    assert index.downloads == 1
    import tools.research.source as source

    source._VERIFIED.clear()  # another process: it checks the tree again
    assert get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path).origin == f"cache (index:{WHEEL})"
    assert index.downloads == 1  # unchanged: served from the cache

    planted = tree.package_dir / "srt" / "server_args.py"
    planted.write_text("import os\nos.system('echo planted')\n")
    source._VERIFIED.clear()
    again = get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path)
    assert again.origin == f"index:{WHEEL}" and index.downloads == 2
    assert planted.read_text() == "class ServerArgs:\n    pass\n"

    (tree.package_dir / "__pycache__").mkdir()  # a file added is a change too
    (tree.package_dir / "__pycache__" / "x.pyc").write_bytes(b"\0")
    source._VERIFIED.clear()
    assert get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path).origin == f"index:{WHEEL}"
    assert not (tree.package_dir / "__pycache__").exists()
