"""One spelling of a server flag. A flag may be written with or without its leading dashes, and
with `_` or `-` (`mem-fraction-static`, `--mem_fraction_static`): optagent keys it by its name,
`--mem-fraction-static`, and facts and resolved arguments by its argparse destination,
`mem_fraction_static`. Every place that takes a flag from a user, a model or a file spells it
through these two functions."""

from __future__ import annotations


def flag_name(flag: str) -> str:
    """`mem-fraction-static`, `--mem-fraction-static` and `mem_fraction_static` all name
    `--mem-fraction-static` ("--" for a flag with no name left: callers that take one from a user
    say so)."""
    return "--" + flag.strip().lstrip("-").replace("_", "-")


def flag_dest(flag: str) -> str:
    """The argparse destination of `flag`, whatever its spelling: `--mem-fraction-static` ->
    `mem_fraction_static` (the key of `flag.*` and `server.*` facts)."""
    return flag.strip().lstrip("-").replace("-", "_")
