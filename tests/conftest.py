"""Shared fixtures: each area keeps its own in tests/fixtures/<area>.py, loaded here."""

pytest_plugins = [
    "tests.fixtures.sglang_src",
    "tests.fixtures.sim",
    "tests.fixtures.real",
    "tests.fixtures.sshd",
    "tests.fixtures.package_index",
    "tests.fixtures.quiet",
    "tests.fixtures.users",
]

# The CLI's module-level consoles fix their width when created if COLUMNS is set then: created here,
# before any test sets COLUMNS for one command, they read the width at every print, whatever order
# the tests run in (pytest-xdist changes the order).
import os  # noqa: E402

os.environ.pop("COLUMNS", None)
import agent.cli.common  # noqa: E402, F401

SERVER_FIXTURES = frozenset(
    {
        "sim_server", "sim_host", "ssh_sim", "sshd", "real_env", "real_host", "package_index",
        "canary_sdist", "sglang_0523", "sglang_059", "sglang_0515", "sglang_049", "sglang_git_repo",
        "synthetic_tree",
    }
)  # fmt: skip
"""Fixtures that start a server or build a source tree or index: a test using one is marked
`server` and left out of the fast tier (`pytest -m "not slow and not server"`, README). A file whose
tests start processes themselves says so with `pytestmark = pytest.mark.server`."""


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """Tests using a server fixture are marked `server` (`SERVER_FIXTURES`).

    The longest tests (marked `slow`, longest first) start first: with pyproject's
    `--dist loadfile --no-loadscope-reorder` their files go to workers of their own as the run
    begins, and the suite ends about when the longest does instead of waiting for it at the end.

    xdist also hands every worker a second file at the start, which waits behind its first: behind
    each of the very long files (minutes) goes a file of few tests, not one that would finish last."""

    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker("server")

    def seconds(item):  # type: ignore[no-untyped-def]
        marker = item.get_closest_marker("slow")
        return marker.kwargs.get("seconds", 60) if marker else 0

    items.sort(key=lambda item: -seconds(item))
    workers = config.getoption("numprocesses", None)
    if not isinstance(workers, int) or workers < 2:
        return
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = list(files)
    first = order[:workers]
    very_long = [f for f in first if max(seconds(i) for i in files[f]) >= 240]
    small = sorted(
        (f for f in order[workers:] if not any(seconds(i) for i in files[f])), key=lambda f: len(files[f])
    )
    behind = small[: len(very_long)]
    rest = [f for f in order[workers:] if f not in behind]
    items[:] = [item for f in [*first, *behind, *rest] for item in files[f]]
