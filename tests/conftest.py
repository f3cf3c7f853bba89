"""Shared fixtures: each area keeps its own in tests/fixtures/<area>.py, loaded here."""

pytest_plugins = [
    "tests.fixtures.sglang_src",
    "tests.fixtures.sim",
    "tests.fixtures.sshd",
]

# The CLI's module-level consoles fix their width when created if COLUMNS is set then: created here,
# before any test sets COLUMNS for one command, they read the width at every print, whatever order
# the tests run in (pytest-xdist changes the order).
import os  # noqa: E402

os.environ.pop("COLUMNS", None)
import agent.cli.common  # noqa: E402, F401


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """The longest tests (marked `slow`, longest first) start first: with pyproject's
    `--dist loadfile --no-loadscope-reorder` their files go to workers of their own as the run
    begins, and the suite ends about when the longest does instead of waiting for it at the end."""

    def seconds(item):  # type: ignore[no-untyped-def]
        marker = item.get_closest_marker("slow")
        return marker.kwargs.get("seconds", 60) if marker else 0

    items.sort(key=lambda item: -seconds(item))
