"""Progress for a long computation whose length is not known ahead: a heartbeat on stderr.

``packrat provision`` searches (hundreds to thousands of simulations, 28-42 s on the paper's
profiles) and ``packrat simulate`` replays up to a million arrivals; both printed nothing
until the end. A heartbeat thread says what is being done, how much of it so far (a counter
the caller advances) and the time elapsed: redrawn in place about once a second on a
terminal, one line every ``log_every_s`` in a log. Nothing is printed for a run that ends
within ``after_s``, so quick runs (and their tests) look as before.

A thread rather than calls from inside the search: the planner stays pure and the simulator's
event loop stays free of per-event checks; the heartbeat only reads an integer.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from packrat.profiler.progress import format_duration

__all__ = ["Counter", "heartbeat"]


class Counter:
    """Work done so far, advanced by the computation (a callback), read by the heartbeat."""

    def __init__(self) -> None:
        self.value = 0

    def __call__(self, *_: object) -> None:
        self.value += 1


@contextmanager
def heartbeat(
    describe: Callable[[], str],
    *,
    stream: TextIO | None = None,
    after_s: float = 2.0,
    tty_every_s: float = 1.0,
    log_every_s: float = 10.0,
) -> Iterator[None]:
    """While the block runs: ``<describe()>, elapsed m:ss`` on ``stream`` (default stderr),
    first after ``after_s``; the line is closed when the block ends. A block that completes
    after ``after_s`` shows the line at least once (the thread may not have run yet); one that
    raises adds nothing to its error."""
    out = stream if stream is not None else sys.stderr
    tty = bool(getattr(out, "isatty", lambda: False)())
    every = tty_every_s if tty else log_every_s
    stop = threading.Event()
    shown = [False]
    started = time.monotonic()

    def line() -> str:
        return f"{describe()}, elapsed {format_duration(time.monotonic() - started)}"

    def beat() -> None:
        if stop.wait(after_s):
            return
        while True:
            out.write(("\r\x1b[2K" + line()) if tty else (line() + "\n"))
            out.flush()
            shown[0] = True
            if stop.wait(every):
                return

    thread = threading.Thread(target=beat, name="packrat-heartbeat", daemon=True)
    thread.start()
    completed = False
    try:
        yield
        completed = True
    finally:
        stop.set()
        thread.join()
        if completed and not shown[0] and time.monotonic() - started >= after_s:
            out.write(line() + "\n")  # a run that outlived after_s says so at least once
        elif shown[0] and tty:
            out.write("\n")
        out.flush()
