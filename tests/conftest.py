"""Shared fixtures: each area keeps its own in tests/fixtures/<area>.py, loaded here."""

pytest_plugins = [
    "tests.fixtures.sglang_src",
    "tests.fixtures.sim",
    "tests.fixtures.sshd",
]
