"""Shared fixtures: each area keeps its own in tests/fixtures/<area>.py, loaded here."""

pytest_plugins = [
    "tests.fixtures.sglang_src",
    "tests.fixtures.sim",
    "tests.fixtures.real",
    "tests.fixtures.sshd",
    "tests.fixtures.package_index",
    "tests.fixtures.quiet",
    "tests.fixtures.schedule",
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
    """Tests using a server fixture are marked `server` (`SERVER_FIXTURES`); the order the files run
    in is tests/fixtures/schedule.py's."""
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker("server")
