"""Ctrl-C and SIGTERM outside a run's event loop (start-up, loading, writing the results):
both raise `Interrupted`, so every `finally` runs (the bundled server is stopped) and the exit
code says which signal. Inside the loop the runner handles them itself (loadgen/benchmark.py)
and puts these handlers back when it ends. Without this, SIGTERM's default action ended the
process at once, skipping every clean-up."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):  # as KeyboardInterrupt: not an error
    """A signal outside the event loop; a BaseException, so `except Exception` lets it by."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for Ctrl-C, 143 for SIGTERM

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def handling_signals(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """`handler` for SIGINT and SIGTERM in the block, the previous ones back after (main
    thread only: elsewhere no handler can be set, and the block runs without)."""
    try:
        previous = {s: signal.signal(s, handler) for s in SIGNALS}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, before in previous.items():
            signal.signal(s, before)


def raising_on_signals() -> contextlib.AbstractContextManager[None]:
    """Both signals raise `Interrupted` in the block."""
    return handling_signals(_raise)
