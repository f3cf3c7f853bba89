"""Pieces every command module shares: the console, config loading and exiting with a clear error."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.segment import Segment

from tools.auth import export_api_key
from tools.config import Config, ConfigError, load_config
from tools.flagname import flag_name
from tools.printable import printable


class TerminalConsole(Console):
    """A rich console that prints no terminal control sequence it did not make itself: a goal, a
    name or a host log line cannot clear the screen, move the cursor or retitle the window
    (`tools.printable`). Only the text of what is printed is cleaned; rich's own styles and the
    cursor moves of its live displays are added after, and kept."""

    def render_str(self, text: str, **kwargs: Any) -> Any:
        """A printed string, `printable` whole before markup and highlighting split it."""
        return super().render_str(printable(text), **kwargs)

    def render(self, renderable: Any, options: Any = None) -> Iterator[Segment]:
        """Every segment of `renderable`, its text `printable` (a `Text` built from host output)."""
        for segment in super().render(renderable, options):
            if (
                segment.control is None
                and segment.text
                and (clean := printable(segment.text)) != segment.text
            ):
                segment = Segment(clean, segment.style)
            yield segment


console = TerminalConsole()
err_console = TerminalConsole(stderr=True)
T = TypeVar("T")

ConfigOption = typer.Option(
    None, "--config", "-c", help="optagent.toml (default: ./optagent.toml or the simulated deployment)."
)


def fail(message: str, *, code: int = 1) -> NoReturn:
    """Print `message` on stderr, on a line of its own, and exit with `code` (1: the work failed, 2:
    bad usage or input). A progress bar still drawn is ended first: after a Ctrl-C, the bar of the
    rollback's wait would otherwise run on with the message glued to its end."""
    from agent.live import end_all

    for shown in (console, err_console):
        end_all(shown)
    err_console.print("[bold red]error:[/] " + escape(message), highlight=False)
    raise typer.Exit(code)


def fail_locked(error: Exception, transcript: Any, *, resumed: bool = False) -> NoReturn:
    """Exit 1 for a session the target's lock refused (`tools.deploy.lock.LockedError`: another
    optagent works on it), in the same words for `run` and `chat`. The session never started, so
    nothing changed. A new transcript is removed: kept, an empty one would become `last` and hide
    the session the user wants to read. A resumed one is the user's saved session: it stays, with
    no second `end` (a later --resume reads the last one and its counters)."""
    from tools.redact import redact_text

    if resumed:
        fail(redact_text(f"{error} (nothing was changed; the saved session stays resumable)"))
    transcript.discard()
    fail(redact_text(f"{error} (nothing was changed, and no transcript kept)"))


def confirm(question: str, *, on: Console = console) -> bool:
    """`typer.confirm(question)` with no progress display drawn over it (`agent.live.held`)."""
    from agent.live import held

    with held(on):
        return typer.confirm(question)


def one_line(message: str, *, simulated: bool = False) -> str:
    """An error for a person: one line, no traceback text (its last line, the error, is kept), and
    for the simulated target the command that shows whether its server runs."""
    text = str(message)
    if "Traceback (most recent call last)" in text:
        head, _, trace = text.partition("Traceback (most recent call last)")
        last = [line.strip() for line in trace.splitlines() if line.strip()][-1:]
        text = " ".join([head.strip().rstrip(":"), *last]).strip()
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    down = ("not healthy", "cannot reach", "ConnectError", "Connection refused", "connect call failed")
    if simulated and any(w.lower() in text.lower() for w in down):
        text += "; is the server running? `optagent sim status`"
    return text


def get_config(path: Path | None) -> Config:
    """Load the config or exit with status 2 naming the bad key."""
    try:
        config = load_config(path)
    except ConfigError as e:
        fail(str(e), code=2)
    export_api_key(config.target.api_key)  # every request of this process sends it; transcripts hide it
    return config


def check_transcripts_dir(cfg: Config) -> None:
    """Exit 2 before any work when the transcripts directory is one another user could write or plant
    in (`tools.localfiles.trusted_dir`): the transcript, report and plot go there."""
    from tools.localfiles import trusted_dir

    try:
        trusted_dir(cfg.agent.transcripts_dir, what="transcripts directory")
    except OSError as e:
        fail(f"{e} (agent.transcripts_dir in optagent.toml; nothing was changed)", code=2)


def normalize_flag(flag: str) -> str:
    """`mem-fraction-static`, `--mem-fraction-static` and `mem_fraction_static` all mean `--mem-fraction-static`."""
    name = flag_name(flag)
    if name == "--":
        raise typer.BadParameter(f"not a flag name: {flag!r}")
    return name


def target_config(path: Path | None) -> Config:
    """The config of a command that changes the target; the simulated deployment is laid out and
    started on demand."""
    cfg = get_config(path)
    if cfg.simulated:
        from sim import host

        try:
            cfg = host.ensure_up(Path(cfg.target.remote_unit).parent)
        except host.SimHostError as e:
            fail(f"cannot start the simulated deployment: {e}")
    return cfg


def run_on_target(coro: Awaitable[T]) -> T:
    """Run a coroutine; turn the deploy layer's errors into a clear message (secrets redacted) and
    exit status 1 (2 for a unit file that is not valid)."""
    from tools.deploy.deployment import DeployError, UnitInvalidError
    from tools.deploy.lock import LockedError
    from tools.deploy.remote import TransportError
    from tools.deploy.service import ServiceError
    from tools.deploy.units.file import UnitFileError
    from tools.redact import redact_text

    try:
        return asyncio.run(coro)  # type: ignore[arg-type]
    except (UnitInvalidError, UnitFileError) as e:
        fail(redact_text(str(e)), code=2)
    except (DeployError, LockedError, TransportError, ServiceError) as e:  # a drift diff holds the unit
        fail(redact_text(str(e)))
    except OSError as e:  # a local file optagent must write (journal, unit copy) is not writable
        fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "))
