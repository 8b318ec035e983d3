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
    first = "tensorflow" not in sys.modules
    if first:
        # TF's C++ start-up chatter (oneDNN, CUDA probing) is noise for this tool.
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    try:
        with capture_native_output(enabled=first):
            import tensorflow as tf
    except ImportError as err:
        raise missing_extra("tensorflow", "convert") from err
    if first:
        _hide_gpus_from_tensorflow(tf)
    tf.get_logger().setLevel(logging.ERROR)
    tf.autograph.set_verbosity(0)
    return tf


def _hide_gpus_from_tensorflow(tf: ModuleType) -> None:
    """Conversion never needs a GPU: hide them from TensorFlow only. Setting CUDA_VISIBLE_DEVICES instead
    (as this did) hid them from the whole process and every child it starts: an onnxruntime CUDA check
    after an export in one process, or `pe-export demo` on a GPU machine, found no GPU."""
    with contextlib.suppress(RuntimeError, ValueError):  # already initialized by the caller: leave it be
        tf.config.set_visible_devices([], "GPU")


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
