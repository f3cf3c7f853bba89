"""`optagent-sim`: the simulated `python -m sglang.launch_server`.

    optagent-sim launch_server --model-path DIR [SGLang flags...]

The scenario and time scale come from `OPTAGENT_SIM_SCENARIO` / `OPTAGENT_SIM_TIME_SCALE`
(see `sim.server`), never from flags, so every flag means what it means to SGLang.
"""

from __future__ import annotations

import sys

USAGE = "usage: optagent-sim launch_server --model-path PATH [SGLang launch_server flags...]\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `optagent-sim` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in ("launch_server", "sglang.launch_server", "serve"):
        sys.stderr.write(USAGE + f"optagent-sim: error: unknown command {command!r}\n")
        return 2
    from sim.server import launch

    return launch(rest)


if __name__ == "__main__":
    sys.exit(main())
