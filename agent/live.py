"""The live displays (progress bars, spinners) optagent runs, known per console: a question holds
them while it waits (`held`), an error ends them before it prints (`end_all`).

optagent keeps this list itself rather than reading rich's: rich keeps a console's running
displays in a private field whose name and shape changed between releases (`_live`, one display,
up to 13.x; `_live_stack` from 14.0), and reading the wrong one made `held` a silent no-op: on
rich 13 the restart-wait bar redrew over `Deploy this change? [y/N]:` and cleared it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator

from rich.console import Console
from rich.live import Live
from rich.progress import Progress

__all__ = ["LiveProgress", "end_all", "held", "running"]

_RUNNING: weakref.WeakKeyDictionary[Console, list[Live]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class LiveProgress(Progress):
    """rich's `Progress`, known to `held` and `end_all` while it runs: every progress display
    optagent shows is one of these."""

    def start(self) -> None:
        """Start the display and note it as running on its console (a disabled one draws nothing)."""
        super().start()
        if self.disable:
            return
        with _LOCK:
            lives = _RUNNING.setdefault(self.console, [])
            if self.live not in lives:
                lives.append(self.live)

    def stop(self) -> None:
        """Forget the display, then stop it."""
        with _LOCK:
            lives = _RUNNING.get(self.console, [])
            if self.live in lives:
                lives.remove(self.live)
        super().stop()


def running(console: Console) -> list[Live]:
    """The live displays optagent runs on `console` now, oldest first."""
    with _LOCK:
        return list(_RUNNING.get(console, []))


@contextlib.contextmanager
def held(console: Console) -> Iterator[None]:
    """Every live display on `console` stopped for the duration, and started again after: a
    question asked inside must stay on the screen while it waits, and a redrawn bar would clear it
    (the user would see a stuck job, not a prompt). A display its owner ended meanwhile stays ended."""
    lives = running(console)
    for live in reversed(lives):
        live.stop()
    try:
        yield
    finally:
        still = running(console)
        for live in lives:
            if live in still:
                live.start()


def end_all(console: Console) -> None:
    """Stop every live display on `console` for good: an error printed next starts on a line of its
    own, not glued to the end of a bar still drawn (after a Ctrl-C, the rollback's wait bar)."""
    with _LOCK:
        lives = _RUNNING.pop(console, [])
    for live in reversed(lives):
        live.stop()
