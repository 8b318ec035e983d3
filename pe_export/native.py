"""Lazy imports of the conversion-side stack, and quieting of native log output.

TensorFlow and its converters print C++ logs straight to file descriptor 2; the CLI
captures them so a report stays readable, and shows them with --verbose.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType

from pe_export.errors import missing_extra


def import_tensorflow() -> ModuleType:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")  # conversion never needs a GPU
    if "tensorflow" not in sys.modules:
        # TF's C++ start-up chatter (oneDNN, CUDA probing) is noise for this tool.
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    try:
        with capture_native_output(enabled="tensorflow" not in sys.modules):
            import tensorflow as tf
    except ImportError as err:
        raise missing_extra("tensorflow", "convert") from err
    tf.get_logger().setLevel(logging.ERROR)
    tf.autograph.set_verbosity(0)
    return tf


class CapturedOutput:
    """Text written to fd 1/2 while captured; empty until the block exits."""

    def __init__(self) -> None:
        self.text = ""


@contextlib.contextmanager
def capture_native_output(enabled: bool = True) -> Iterator[CapturedOutput]:
    """Redirect the process's stdout/stderr file descriptors to a temp file for the block."""
    captured = CapturedOutput()
    if not enabled:
        yield captured
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with tempfile.TemporaryFile(mode="w+b") as sink:
        try:
            for fd in saved:
                os.dup2(sink.fileno(), fd)
            yield captured
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            captured.text = sink.read().decode("utf-8", errors="replace")
