"""What a fetched SGLang source is checked against: the sha256 the package index publishes for the
wheel pip downloaded (its PEP 691 JSON page or the `#sha256=` of its PEP 503 HTML page), and the
content digest of an unpacked tree, recorded when it is unpacked and checked when the cache
serves it. `tools.research.source_fetch` and `tools.research.source` use them."""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import ssl
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

DEFAULT_INDEX = "https://pypi.org/simple"
_JSON = "application/vnd.pypi.simple.v1+json"
_ANCHOR = re.compile(r"""<a\s[^>]*href\s*=\s*["']([^"']+)["']""", re.IGNORECASE)


def pip_settings() -> dict[str, list[str]]:
    """`index-url`, `extra-index-url` and `cert` as pip sees them (its files and `PIP_*` variables,
    through `pip config list`), each with every value found, the environment's first."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found: dict[str, list[str]] = {"index-url": [], "extra-index-url": [], "cert": []}
    lines = sorted(done.stdout.splitlines(), key=lambda line: not line.startswith(":env:"))
    for line in lines:
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in found:
            found[name] += value.strip().strip("'\"").split()
    return found


def index_urls(settings: dict[str, list[str]]) -> list[str]:
    """The package indexes of pip's `settings`: its index (PyPI's unless configured) and extras."""
    main = settings["index-url"][:1] or [DEFAULT_INDEX]
    return list(dict.fromkeys(main + settings["extra-index-url"]))


def _page(
    index: str, project: str, *, timeout: float, verify: ssl.SSLContext | bool
) -> tuple[str, str] | None:
    """(content type, text) of the project's page on one index; None when it has none."""
    url = index.rstrip("/") + f"/{project}/"
    if url.startswith("file:"):
        folder = Path(unquote(urlsplit(url).path))
        page = folder / "index.html"
        return ("text/html", page.read_text(errors="replace")) if page.is_file() else None
    import httpx

    try:
        headers = {"Accept": f"{_JSON}, text/html;q=0.1"}
        resp = httpx.get(url, headers=headers, timeout=timeout, follow_redirects=True, verify=verify)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    return resp.headers.get("content-type", ""), resp.text


def _hashes_on(content_type: str, text: str, filename: str) -> set[str]:
    """The sha256 values a project page gives `filename`."""
    if content_type.startswith(_JSON):
        files = json.loads(text).get("files", [])
        return {
            f["hashes"]["sha256"].lower()
            for f in files
            if f.get("filename") == filename and isinstance(f.get("hashes", {}).get("sha256"), str)
        }
    out = set()
    for href in _ANCHOR.findall(text):
        target, _, fragment = html.unescape(href).partition("#")
        if unquote(target.rsplit("/", 1)[-1]) == filename and fragment.startswith("sha256="):
            out.add(fragment.removeprefix("sha256=").lower())
    return out


def published_sha256(filename: str, *, project: str = "sglang", timeout: float = 60.0) -> set[str]:
    """The sha256 values the configured indexes publish for `filename` (empty: none publishes one)."""
    settings = pip_settings()
    cert = settings["cert"]
    verify: ssl.SSLContext | bool = True
    if cert and Path(cert[0]).is_file():  # the CA bundle pip is told to trust
        verify = ssl.create_default_context(cafile=cert[0])
    found: set[str] = set()
    for index in index_urls(settings):
        page = _page(index, project, timeout=timeout, verify=verify)
        if page is not None:
            found |= _hashes_on(*page, filename)
    return found


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, hex."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_digest(root: Path, *, skip: frozenset[str] = frozenset()) -> str:
    """A sha256 over every entry under `root` (relative path, kind, and a file's bytes or a link's
    target; `skip`: top-level names left out): any file added, removed or changed changes it."""
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        here = Path(folder)
        rel_folder = here.relative_to(root)
        names = sorted(files + [d for d in dirs if (here / d).is_symlink()])
        for name in names:
            rel = (rel_folder / name).as_posix()
            if rel in skip:
                continue
            path = here / name
            if path.is_symlink():
                h.update(f"L\0{rel}\0{os.readlink(path)}\n".encode())
            elif path.is_file():
                h.update(f"F\0{rel}\0{path.stat().st_size}\0".encode())
                h.update(bytes.fromhex(file_sha256(path)))
            else:  # a socket, a fifo: never in an unpacked tree
                h.update(f"O\0{rel}\n".encode())
        for d in dirs:
            if not (here / d).is_symlink():
                h.update(f"D\0{(rel_folder / d).as_posix()}\n".encode())
    return h.hexdigest()
