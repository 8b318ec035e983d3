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
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

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


class _Redirect:
    """The process's one redirection of fds 1 and 2: file descriptors are process-wide, so the blocks that capture
    share it. The first block in redirects, the last one out restores. Interpreters invoked in threads (one per
    core) each captured their first call: the second thread saved the fds while they pointed at the first's temp
    file and put that file back when it finished, and every later line the process printed (the CLI's report
    included) went into a deleted file."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.saved: dict[int, int] = {}
        self.sink: Any = None

    def enter(self) -> int:
        """Redirect (if no block already has) and return the sink's offset where this block's text starts."""
        with self.lock:
            sys.stdout.flush()
            sys.stderr.flush()
            if self.depth == 0:
                self.sink = tempfile.TemporaryFile(mode="w+b")
                self.saved = {fd: os.dup(fd) for fd in (1, 2)}
                for fd in self.saved:
                    os.dup2(self.sink.fileno(), fd)
            self.depth += 1
            return int(os.lseek(self.sink.fileno(), 0, os.SEEK_END))

    def leave(self, start: int) -> str:
        """What was written since ``start`` (every thread's), restoring the fds if this is the last block."""
        with self.lock:
            sys.stdout.flush()
            sys.stderr.flush()
            sink = self.sink
            text = os.pread(sink.fileno(), max(0, os.fstat(sink.fileno()).st_size - start), start)
            self.depth -= 1
            if self.depth == 0:
                for fd, copy in self.saved.items():
                    os.dup2(copy, fd)
                    os.close(copy)
                self.saved, self.sink = {}, None
                sink.close()
            return text.decode("utf-8", errors="replace")


_REDIRECT = _Redirect()  # process-wide because file descriptors are


@contextlib.contextmanager
def capture_native_output(enabled: bool = True) -> Iterator[CapturedOutput]:
    """Redirect the process's stdout/stderr file descriptors to a temp file for the block (thread-safe: blocks
    that overlap, in one thread or several, share one redirection); the text written meanwhile is in the
    yielded object's ``text`` once the block exits."""
    captured = CapturedOutput()
    if not enabled:
        yield captured
        return
    start = _REDIRECT.enter()
    try:
        yield captured
    finally:
        captured.text = _REDIRECT.leave(start)
