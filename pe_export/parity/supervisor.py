"""A parity check in a child process, so that a runtime that crashes or hangs is reported, not fatal.

The child (a fork of this process where that is safe, else ``python -m pe_export.parity.supervisor REQUEST``)
runs the whole check in-process (pe_export/parity/inprocess.py) and answers over its stdout with length-
prefixed frames: a heartbeat when the runtime has loaded the model and after every batch, then the report as
JSON, or an error (message and exit code). This process times each heartbeat against ``timeout_s`` and turns a
crash, a hang or an error into one line; it never imports numpy or a runtime, so checking costs little more
than the runtime's own process. The child moves its own stdout to stderr first: native logs cannot corrupt the
protocol.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import IO, Any, Protocol

from pe_export.errors import ExitCode, PeExportError, RuntimeUnavailableError
from pe_export.interrupts import raise_if_interrupted
from pe_export.parity.result import ParityOptions, ParityReport, bisection_steps

# The command that starts the child Python, when sys.executable cannot be exec'd directly (an
# emulated interpreter behind a launcher script, say). Split on whitespace.
CHILD_PYTHON_ENV = "PE_EXPORT_PYTHON"
_HEARTBEAT, _REPORT, _ERROR = b"H", b"R", b"E"
_POLL_S = 0.25  # how often a wait looks for an interrupt
_MAX_PROGRESS = 1 + 100_000  # heartbeats where the bundle's batch count cannot be read here


def _errors_by_code() -> dict[int, type[PeExportError]]:
    found: dict[int, type[PeExportError]] = {}
    pending = list(PeExportError.__subclasses__())
    while pending:
        cls = pending.pop()
        found.setdefault(int(cls.exit_code), cls)
        pending.extend(cls.__subclasses__())
    return found


def check_in_child(model: Path, bundle: Path, options: ParityOptions) -> ParityReport:
    """Run check_parity(model, bundle, options without isolation) in a child; its report, or its error."""
    request = {"model": str(model), "bundle": str(bundle), "options": asdict(replace(options, isolate=False))}
    python = os.environ.get(CHILD_PYTHON_ENV, "").split()
    with tempfile.TemporaryFile() as stderr:
        if not python and fork_is_safe():
            process: _Process = _Forked.start(request, stderr)
        else:
            process = _spawn(python or [sys.executable], request, stderr)
        watch = _Watch(process, stderr, model, options.timeout_s, _progress_limit(bundle, options.layers))
        try:
            return watch.report()
        finally:
            watch.close()


# Where the OS does not say how many threads the process has: modules that start native threads or hold
# locks a forked child could inherit mid-use. With any of them loaded, the child is a fresh interpreter.
_NOT_FORKABLE = ("numpy", "tensorflow", "onnxruntime", "onnx", "ai_edge_litert", "tflite_runtime", "torch")


def fork_is_safe() -> bool:
    """True in a single-threaded process (the `pe-export parity` command): there the child is a fork, which
    skips a second interpreter's start and imports; it still has its own memory, so a crash stays its own.

    A fork copies only the calling thread, so a lock another thread holds stays held in the child forever:
    the process must have no other thread, native ones included (a BLAS pool, a runtime's workers). Counted
    where the OS lists them (Linux); elsewhere judged by Python's threads and the modules loaded."""
    if not hasattr(os, "fork"):
        return False
    threads = _os_threads()
    if threads is not None:
        return threads == 1
    return threading.active_count() == 1 and not any(name in sys.modules for name in _NOT_FORKABLE)


def _os_threads() -> int | None:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def _progress_limit(bundle: Path, layers: bool = False) -> int:
    """How many heartbeats a check of ``bundle`` sends at most: one when the runtime has loaded, one per batch
    and pass (``layers``: the pass with the tensors kept, or a bisection's cut files: layers/check.py).
    Each waits at most --timeout, so the whole run is bounded too. A manifest this process cannot read (the
    child says why) leaves the largest count a valid bundle can declare."""
    try:
        manifest = json.loads((Path(bundle) / "manifest.json").read_text(encoding="utf-8"))
        batches = manifest["batches"]
        passes = 1
        if layers:
            passes += max(1, bisection_steps(len(manifest.get("layers") or [])))
        return 1 + passes * len(batches) if isinstance(batches, list) else _MAX_PROGRESS
    except (OSError, ValueError, KeyError, TypeError):
        return _MAX_PROGRESS


class _Process(Protocol):
    stdout: IO[bytes] | None

    def poll(self) -> int | None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...


def _spawn(python: list[str], request: dict[str, Any], stderr: IO[bytes]) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            [*python, "-m", "pe_export.parity.supervisor", json.dumps(request)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    except OSError as err:
        raise RuntimeUnavailableError(
            f"could not start the parity check's child process with {' '.join(python)} ({err.strerror}); "
            f"set {CHILD_PYTHON_ENV} to a command that starts this Python, or pass --no-isolate"
        ) from err


class _Forked:
    """A forked child serving one request, with the part of Popen's interface _Watch uses."""

    def __init__(self, pid: int, stdout: IO[bytes]) -> None:
        self.pid = pid
        self.stdout: IO[bytes] | None = stdout
        self.returncode: int | None = None

    @classmethod
    def start(cls, request: dict[str, Any], stderr: IO[bytes]) -> _Forked:
        read_end, write_end = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            code = 1
            try:
                os.close(read_end)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(stderr.fileno(), 2)
                os.dup2(2, 1)  # anything printed to stdout goes to stderr, not into the protocol
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # the parent handles Ctrl-C and kills the child
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                with os.fdopen(write_end, "wb") as outbox:
                    _serve(request, outbox)
                code = 0
            finally:
                os._exit(code)  # no atexit handlers, no flush of buffers copied from the parent
        os.close(write_end)
        return cls(pid, os.fdopen(read_end, "rb", buffering=0))

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None and self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode


def signal_name(number: int) -> str:
    """A signal's name (SIGSEGV, SIGRTMIN+3), or its number where it has none."""
    try:
        return signal.Signals(number).name
    except ValueError:
        low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
        if low is not None and high is not None and low <= number <= high:
            return f"SIGRTMIN+{number - low}"
        return str(number)


class _Watch:
    """Reads the child's frames with a deadline per frame and at most one heartbeat per step of the work
    (``progress``), so a whole run is bounded; kills the child on a hang, an endless run or an interrupt."""

    def __init__(self, process: _Process, stderr: IO[bytes], model: Path, timeout_s: float, progress: int) -> None:
        self.process, self.stderr, self.model, self.timeout_s = process, stderr, model, timeout_s
        self.doing, self.progress = "loading", progress

    def report(self) -> ParityReport:
        beats = 0
        while True:
            kind, payload = self._frame()
            if kind == _HEARTBEAT:
                self.doing, beats = "running", beats + 1
                if beats > self.progress:  # alive, but past the work there is: bounded as a hang is
                    self.process.kill()
                    raise RuntimeUnavailableError(
                        f"the runtime's process went on past the bundle's work ({self.progress} steps: loading and "
                        f"each batch) while checking {self.model.name}; it was killed"
                    )
            elif kind == _REPORT:
                return ParityReport.from_dict(json.loads(payload))
            else:
                error = json.loads(payload)
                cls = _errors_by_code().get(error["exit_code"], RuntimeUnavailableError)
                raise cls(error["message"])

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()

    def _frame(self) -> tuple[bytes, bytes]:
        header = self._read(9)
        return header[:1], self._read(struct.unpack(">Q", header[1:])[0])

    def _read(self, size: int) -> bytes:
        assert self.process.stdout
        stream = self.process.stdout
        deadline = time.monotonic() + self.timeout_s
        chunks, remaining = [], size
        with selectors.DefaultSelector() as selector:
            selector.register(stream, selectors.EVENT_READ)
            while remaining:
                raise_if_interrupted()
                left = deadline - time.monotonic()
                if left <= 0:
                    self.process.kill()
                    raise RuntimeUnavailableError(
                        f"the runtime did not answer within {self.timeout_s:g} s while {self.doing} "
                        f"{self.model.name}; its process was killed (if it is only slow, e.g. building a TensorRT "
                        "engine, raise --timeout)"
                    )
                if not selector.select(timeout=min(left, _POLL_S)):
                    continue
                chunk = os.read(stream.fileno(), min(remaining, 1 << 20))
                if not chunk:
                    raise self._crashed()
                chunks.append(chunk)
                remaining -= len(chunk)
        return b"".join(chunks)

    def _crashed(self) -> RuntimeUnavailableError:
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        how = f"signal {signal_name(-code)}" if code < 0 else f"exit status {code}"
        return RuntimeUnavailableError(
            f"the runtime crashed ({how}) while {self.doing} {self.model.name}{self._stderr_tail()}"
        )

    def _stderr_tail(self) -> str:
        self.stderr.seek(0)
        lines = [line for line in self.stderr.read().decode(errors="replace").splitlines() if line.strip()]
        return f": {lines[-1].strip()[:200]}" if lines else ""


# --- child side -------------------------------------------------------------------------


def _send(outbox: IO[bytes], kind: bytes, payload: bytes = b"") -> None:
    outbox.write(kind + struct.pack(">Q", len(payload)) + payload)
    outbox.flush()


def _serve(request: dict[str, Any], outbox: IO[bytes]) -> None:
    options = dict(request["options"])
    options["providers"] = tuple(options["providers"])
    try:
        from pe_export.parity.inprocess import run_check

        parsed = ParityOptions(**options)
        parsed.validate()
        report = run_check(Path(request["model"]), Path(request["bundle"]), parsed, lambda: _send(outbox, _HEARTBEAT))
    except PeExportError as err:
        message = {"exit_code": int(err.exit_code), "message": str(err)}
    except Exception as err:  # report, don't die silently: the parent turns it into one line
        message = {"exit_code": int(ExitCode.RUNTIME_UNAVAILABLE), "message": f"{type(err).__name__}: {err}"}
    else:
        _send(outbox, _REPORT, json.dumps(report.to_dict()).encode())
        return
    _send(outbox, _ERROR, json.dumps(message).encode())


def main() -> None:
    outbox = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else printed to stdout goes to stderr, not into the protocol
    _serve(json.loads(sys.argv[1]), outbox)


if __name__ == "__main__":
    main()
