"""Ctrl-C and SIGTERM that cannot be lost.

Python raises a signal's exception at the next bytecode the main thread runs. When that bytecode belongs to
a finalizer or a callback run from C (TensorFlow's, numpy's), the exception is printed as "ignored" and the
work goes on: measured, a SIGINT sent to `pe-export golden` mid-bundle once let it run to the end and exit
0. The handlers here also record the signal, and long loops call ``raise_if_interrupted`` between steps.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that every cleanup (temp files, temp dirs) runs."""


_received: list[int] = []  # signals received in this process; the CLI's handlers append


def _interrupt(signum: int, frame: object) -> None:
    _received.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def received_interruption() -> BaseException | None:
    """The exception for the last signal received in the block (None if none came).

    An error that ends a command after a signal came is reported as the interruption: a signal that lands
    inside a C call can surface as that call's SystemError with the signal's exception not chained to it.
    """
    if not _received:
        return None
    return Terminated() if _received[-1] == signal.SIGTERM else KeyboardInterrupt()


def raise_if_interrupted() -> None:
    """Raise the interruption a finalizer may have swallowed; called between the steps of long loops."""
    interruption = received_interruption()
    if interruption is not None:
        raise interruption


@contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise (KeyboardInterrupt, Terminated) and are remembered, for the block."""
    previous = {number: signal.signal(number, _interrupt) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        _received.clear()
