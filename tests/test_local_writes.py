"""Nothing optagent writes on this machine goes through another user's link (issue 52, item 3).

A second local user in a shared group plants `<id>.report.md -> FILE` and `<id>.png -> FILE` in
the transcripts directory as each `.jsonl` appears: the run replaces the links, never writes
through them; a directory that group can write (no sticky bit) is refused before anything runs;
exports, transcripts, benchmark results and state files hold to the same rule.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.users import GROUP, as_user
from tests.test_run_json import _config_file
from tools.localfiles import UntrustedDirError, UntrustedFileError, open_append, trusted_dir, write_text

CLI = [sys.executable, "-c", "from agent.cli.main import app; app()"]
ROOT = Path(__file__).parents[1]


def _shared(mode: int) -> Path:
    path = Path(tempfile.mkdtemp(prefix="optagent-tx-", dir="/tmp"))
    os.chown(path, 0, grp.getgrnam(GROUP).gr_gid)
    path.chmod(mode)
    return path


@pytest.fixture
def victim() -> Iterator[Path]:
    """A file of root's that the other user can name but not write."""
    home = Path(tempfile.mkdtemp(prefix="optagent-victim-", dir="/tmp"))
    home.chmod(0o755)
    precious = home / "precious"
    precious.write_text("root's data\n")
    precious.chmod(0o644)
    try:
        yield precious
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _config(sim_host, tmp_path: Path, transcripts: Path) -> Path:  # type: ignore[no-untyped-def]
    config = _config_file(sim_host, tmp_path)
    text = config.read_text().replace(json.dumps(str(tmp_path / "tx")), json.dumps(str(transcripts)))
    config.write_text(text)
    return config


def test_a_run_replaces_links_planted_in_a_shared_sticky_transcripts_dir(
    sim_host, other_user: str, victim: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    shared = _shared(0o3775)  # root:optagent-shared, setgid and sticky
    planter = subprocess.Popen(
        ["runuser", "-u", other_user, "--", "sh", "-c",
         f'while :; do for f in {shared}/*.jsonl; do [ -e "$f" ] || continue; b=${{f%.jsonl}}; '
         f'ln -s {victim} "$b.report.md" 2>/dev/null; ln -s {victim} "$b.png" 2>/dev/null; done; sleep 0.02; done'],
        start_new_session=True,  # its own group: killed whole, runuser's shell included
    )  # fmt: skip
    try:
        config = _config(sim_host, tmp_path, shared)
        done = subprocess.run([*CLI, "run", "--config", str(config), "--dry-run", "--json"],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        os.killpg(planter.pid, signal.SIGKILL)  # runuser does not pass a kill on to its child
        planter.wait()
    try:
        assert victim.read_text() == "root's data\n"  # never written through the links
        transcript = Path(json.loads(done.stdout)["transcript"])
        report = transcript.with_name(transcript.stem + ".report.md")
        plot = transcript.with_name(transcript.stem + ".png")
        for path in (transcript, report, plot):
            assert not path.is_symlink() and path.stat().st_uid == 0, path
        assert report.read_text().startswith("#") and plot.read_bytes().startswith(b"\x89PNG")
        assert not [p for p in shared.iterdir() if p.name.endswith(".optagent-tmp")]
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_transcripts_dir_the_group_can_write_is_refused_before_anything_runs(
    sim_host, other_user: str, victim: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    shared = _shared(0o2775)  # root:optagent-shared, group-writable, not sticky: as the attack had it
    try:
        config = _config(sim_host, tmp_path, shared)
        done = subprocess.run([*CLI, "run", "--config", str(config), "--yes"],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 2, done.stderr[-3000:]
        said = " ".join(done.stderr.split())
        assert f"transcripts directory {shared}: {shared} is writable by group or others (mode 2775)" in said
        assert f"run `chmod go-w {shared}` (or `chmod +t {shared}`)" in said
        assert list(shared.iterdir()) == []  # no transcript, no report
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_export_transcript_and_results_never_follow_what_another_user_planted(
    sim_host, other_user: str, victim: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from agent.transcripts.transcript import Transcript
    from tools.bench.results import SweepResult
    from tools.deploy.remote import write_local_atomic

    shared = _shared(0o1777)  # like /tmp
    try:
        made = as_user(other_user, f"ln -s {victim} {shared}/out.html && ln -s {victim} {shared}/sweep.json "
                                   f"&& ln -s {victim} {shared}/known-good.service && touch {shared}/theirs.txt")  # fmt: skip
        assert made.returncode == 0, made.stderr
        config = _config(sim_host, tmp_path, tmp_path / "tx")
        t = Transcript.create(tmp_path / "tx", kind="run", goal="g", model="m", target="t")
        t.close({"status": "done"})
        done = subprocess.run([*CLI, "transcripts", "export", t.id, "--format", "html", "-o", str(shared / "out.html"),
                               "--config", str(config)], capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        SweepResult(endpoint="http://x", api="generate").save(shared / "sweep.json")
        write_local_atomic(shared / "known-good.service", "[Service]\n")
        assert victim.read_text() == "root's data\n"
        for name in ("out.html", "sweep.json", "known-good.service"):
            assert not (shared / name).is_symlink() and (shared / name).stat().st_uid == 0, name
        assert "<html" in (shared / "out.html").read_text()

        # a transcript opened for appending: a planted link, fifo or file of theirs is refused
        as_user(other_user, f"ln -s {victim} {shared}/a.jsonl && mkfifo {shared}/b.jsonl")
        for name, why in [("a", "is a symlink"), ("b", "is a fifo"), ("theirs.txt", "is owned by uid")]:
            with pytest.raises(UntrustedFileError, match=why):
                open_append(shared / (name if "." in name else f"{name}.jsonl"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            planted = Transcript(shared / "a.jsonl", {"type": "header", "id": "a"})
            planted.event("note", {"x": 1})
        assert planted.failed and "is a symlink" in str(caught[0].message)
        assert victim.read_text() == "root's data\n"
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_directories_are_held_to_the_run_dir_rule(other_user: str, tmp_path: Path) -> None:
    other = pwd.getpwnam(other_user).pw_uid
    theirs = Path(tempfile.mkdtemp(prefix="optagent-theirs-", dir="/tmp"))
    try:
        os.chown(theirs, other, -1)
        with pytest.raises(UntrustedDirError, match=f"is owned by uid {other}, not by uid 0 or root"):
            write_text(theirs / "report.md", "x")
        link = Path(tempfile.mkdtemp(prefix="optagent-links-", dir="/tmp"))
        link.chmod(0o1777)
        made = as_user(other_user, f"ln -s {tmp_path} {link}/tx")  # points at root's own directory
        assert made.returncode == 0, made.stderr
        with pytest.raises(
            UntrustedDirError, match=f"the symlink {link}/tx on the way is owned by uid {other}"
        ):
            write_text(link / "tx" / "report.md", "x")
        assert not (tmp_path / "report.md").exists()
        (tmp_path / "mine").symlink_to(tmp_path / "real", target_is_directory=True)
        (tmp_path / "real").mkdir()
        assert trusted_dir(tmp_path / "mine") == (tmp_path / "real").resolve()  # our own link is fine
        shutil.rmtree(link, ignore_errors=True)
    finally:
        shutil.rmtree(theirs, ignore_errors=True)
