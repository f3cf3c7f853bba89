"""What a fetched SGLang source is checked against: a wheel is used only with the sha256 its index
publishes, an sdist is never built, and a cached tree is served only while its content is what was
unpacked. Real pip against a package index on loopback."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.package_index import PackageIndex, canary_sdist
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


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_wheel_is_used_with_the_sha256_its_index_publishes_and_recorded(
    package_index: PackageIndex, tmp_path: Path
) -> None:
    wheel = _wheel()
    package_index.publish("sglang", WHEEL, wheel, _sha(wheel))
    tree = get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path)
    assert tree.origin == f"index:{WHEEL}"
    record = json.loads((tree.root / "optagent-source.json").read_text())
    assert record["sha256"] == _sha(wheel)
    assert record["digest"] == tree_digest(tree.root, skip=SKIPPED)
    assert (tree.package_dir / "srt" / "server_args.py").read_text() == "class ServerArgs:\n    pass\n"


def test_a_wheel_its_index_publishes_no_sha256_for_is_not_used(
    package_index: PackageIndex, tmp_path: Path
) -> None:
    wheel = _wheel()
    package_index.publish("sglang", WHEEL, wheel, None)
    with pytest.raises(SourceError, match=f"no index publishes a sha256 for {WHEEL}"):
        get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path)
    assert package_index.downloads == 1  # pip did download it: the refusal is ours
    assert not (tmp_path / "sglang-src" / VERSION).exists()


def test_a_wheel_with_another_sha256_than_published_is_not_used(
    package_index: PackageIndex, tmp_path: Path
) -> None:
    package_index.publish("sglang", WHEEL, _wheel(), _sha(b"another wheel"))
    with pytest.raises(SourceError, match="package index"):
        get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path)
    assert not (tmp_path / "sglang-src" / VERSION).exists()


def test_an_sdist_is_never_built_on_this_machine(package_index: PackageIndex, tmp_path: Path) -> None:
    """An index with only an sdist: its build backend would run to prepare it; the index fails as
    having no wheel, and nothing of the sdist ran."""
    canary = tmp_path / "canary"
    sdist = canary_sdist("sglang", VERSION, canary)
    package_index.publish("sglang", SDIST, sdist, _sha(sdist))
    with pytest.raises(SourceError) as err:
        get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path / "cache")
    assert not canary.exists()
    assert "an sdist is never built" in str(err.value)
    assert not (tmp_path / "cache" / "sglang-src" / VERSION).exists()


def test_a_cached_tree_changed_since_it_was_unpacked_is_fetched_again(
    package_index: PackageIndex, tmp_path: Path
) -> None:
    wheel = _wheel()
    package_index.publish("sglang", WHEEL, wheel, _sha(wheel))
    tree = get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path)
    assert package_index.downloads == 1
    import tools.research.source as source

    source._VERIFIED.clear()  # another process: it checks the tree again
    assert get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path).origin == f"cache (index:{WHEEL})"
    assert package_index.downloads == 1  # unchanged: served from the cache

    planted = tree.package_dir / "srt" / "server_args.py"
    planted.write_text("import os\nos.system('echo planted')\n")
    source._VERIFIED.clear()
    again = get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path)
    assert again.origin == f"index:{WHEEL}" and package_index.downloads == 2
    assert planted.read_text() == "class ServerArgs:\n    pass\n"

    (tree.package_dir / "__pycache__").mkdir()  # a file added is a change too
    (tree.package_dir / "__pycache__" / "x.pyc").write_bytes(b"\0")
    source._VERIFIED.clear()
    assert get_source(VERSION, repo_url=NO_GIT, cache_dir=tmp_path).origin == f"index:{WHEEL}"
    assert not (tree.package_dir / "__pycache__").exists()
