"""A Ctrl-C that lands in a finalizer is printed as "ignored" by Python and the work would go on; the
recorded signal stops it at the next step instead."""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

import pytest

from pe_export.interrupts import interruptible, raise_if_interrupted


class _InterruptedWhileFinalized:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, inside the finalizer
        time.sleep(0.05)


def test_an_interrupt_swallowed_by_a_finalizer_still_stops_the_next_step(monkeypatch: pytest.MonkeyPatch) -> None:
    swallowed: list[type[BaseException]] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: swallowed.append(info.exc_type))
    with interruptible():
        finalized = _InterruptedWhileFinalized()
        del finalized
        gc.collect()
        assert swallowed == [KeyboardInterrupt]  # Python printed it as "ignored" and went on
        with pytest.raises(KeyboardInterrupt):
            raise_if_interrupted()
    raise_if_interrupted()  # outside the block nothing is remembered: no raise
