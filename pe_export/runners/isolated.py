"""Run any registered runner in a child process, so a runtime that crashes or hangs is reported.

The parent talks to ``python -m pe_export.runners.isolated`` over the child's stdin/stdout
with length-prefixed frames; arrays travel as .npz bytes (never pickle). The child moves
its own stdout to stderr first, so native logs cannot corrupt the protocol.
"""

from __future__ import annotations

import io
import json
import os
import selectors
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import numpy as np

from pe_export.errors import ExitCode, PeExportError, RuntimeUnavailableError
from pe_export.runners.base import Runner, create_runner
from pe_export.specs import TensorSpec

DEFAULT_TIMEOUT_S = 120.0
# The command that starts a child Python, when sys.executable cannot be exec'd directly
# (an emulated interpreter behind a launcher script, say). Split on whitespace.
CHILD_PYTHON_ENV = "PE_EXPORT_PYTHON"
_READY, _OUTPUTS, _ERROR = b"R", b"O", b"E"  # frame kinds: ready, outputs, error
_ERRORS_BY_CODE = {int(cls.exit_code): cls for cls in PeExportError.__subclasses__()}


def encode_arrays(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def decode_arrays(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


class IsolatedRunner(Runner):
    """Wraps the runner named ``runner`` in a child process with a per-call timeout."""

    name = "isolated"
    file_suffixes = ()

    def __init__(self, runner: str, model_path: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S, **options: Any):
        super().__init__(model_path, **options)
        self.runner_name = runner
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._inputs: list[TensorSpec] = []
        self._outputs: list[str] = []
        self._describe = runner

    def activate(self) -> None:
        request = {"runner": self.runner_name, "model": str(self.model_path), "options": self._child_options()}
        self._stderr = tempfile.TemporaryFile()
        python = os.environ.get(CHILD_PYTHON_ENV, "").split() or [sys.executable]
        try:
            self._process = subprocess.Popen(
                [*python, "-m", "pe_export.runners.isolated", json.dumps(request)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
            )
        except OSError as err:
            raise RuntimeUnavailableError(
                f"could not start the runtime's child process with {' '.join(python)} ({err.strerror}); "
                f"set {CHILD_PYTHON_ENV} to a command that starts this Python, or pass --no-isolate"
            ) from err
        payload = self._receive("loading")
        ready = json.loads(payload)
        self._inputs = [TensorSpec(s["name"], s["dtype"], tuple(s["shape"])) for s in ready["inputs"]]
        self._outputs = ready["outputs"]
        self._describe = ready["describe"]

    def _child_options(self) -> dict[str, Any]:
        options = dict(self.options)
        if self.threads:
            options["threads"] = self.threads
        if "providers" in options:
            options["providers"] = list(options["providers"])
        return options

    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._send(encode_arrays(feed))
        return decode_arrays(self._receive("running"))

    def input_specs(self) -> list[TensorSpec]:
        return self._inputs

    def output_names(self) -> list[str]:
        return self._outputs

    def describe(self) -> str:
        return self._describe

    def deactivate(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if process.poll() is None and process.stdin:
                process.stdin.write(struct.pack(">Q", 0))
                process.stdin.close()
            process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        if self._stderr:
            self._stderr.close()

    # --- protocol ---------------------------------------------------------------------

    def _send(self, payload: bytes) -> None:
        assert self._process and self._process.stdin
        try:
            self._process.stdin.write(struct.pack(">Q", len(payload)) + payload)
            self._process.stdin.flush()
        except BrokenPipeError:
            raise self._crashed("running") from None

    def _receive(self, doing: str) -> bytes:
        header = self._read_exact(9, doing)
        kind, size = header[:1], struct.unpack(">Q", header[1:])[0]
        payload = self._read_exact(size, doing)
        if kind == _ERROR:
            error = json.loads(payload)
            cls = _ERRORS_BY_CODE.get(error["exit_code"], RuntimeUnavailableError)
            raise cls(error["message"])
        return payload

    def _read_exact(self, size: int, doing: str) -> bytes:
        assert self._process and self._process.stdout
        stream = self._process.stdout
        deadline = time.monotonic() + self.timeout_s
        chunks, remaining = [], size
        with selectors.DefaultSelector() as selector:
            selector.register(stream, selectors.EVENT_READ)
            while remaining:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(timeout=left):
                    self._process.kill()
                    self._process.wait()
                    raise RuntimeUnavailableError(
                        f"{self.runner_name} did not answer within {self.timeout_s:g} s while {doing} "
                        f"{self.model_path.name}; the child process was killed (if it is only slow, e.g. "
                        "building a TensorRT engine, raise --timeout)"
                    )
                chunk = os.read(stream.fileno(), min(remaining, 1 << 20))
                if not chunk:
                    raise self._crashed(doing)
                chunks.append(chunk)
                remaining -= len(chunk)
        return b"".join(chunks)

    def _crashed(self, doing: str) -> RuntimeUnavailableError:
        assert self._process
        try:
            code = self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return RuntimeUnavailableError(
            f"{self.runner_name} crashed ({how}) while {doing} {self.model_path.name}{self._stderr_tail()}"
        )

    def _stderr_tail(self) -> str:
        if not self._stderr:
            return ""
        self._stderr.seek(0)
        lines = [line for line in self._stderr.read().decode(errors="replace").splitlines() if line.strip()]
        return f": {lines[-1].strip()[:200]}" if lines else ""


# --- child side -------------------------------------------------------------------------


def _frame(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack(">Q", len(payload)) + payload


def _serve(request: dict[str, Any], inbox: IO[bytes], outbox: IO[bytes]) -> None:
    options = request["options"]
    if "providers" in options:
        options["providers"] = tuple(options["providers"])
    try:
        runner = create_runner(request["runner"], Path(request["model"]), **options)
        runner.activate()
        ready = {
            "inputs": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in runner.input_specs()],
            "outputs": runner.output_names(),
            "describe": runner.describe(),
        }
        outbox.write(_frame(_READY, json.dumps(ready).encode()))
        outbox.flush()
        while True:
            header = inbox.read(8)
            if len(header) < 8:
                return
            size = struct.unpack(">Q", header)[0]
            if size == 0:
                return
            outputs = runner.infer(decode_arrays(inbox.read(size)))
            outbox.write(_frame(_OUTPUTS, encode_arrays(outputs)))
            outbox.flush()
    except PeExportError as err:
        message = {"exit_code": int(err.exit_code), "message": str(err)}
    except Exception as err:  # report, don't die silently: the parent turns it into one line
        message = {"exit_code": int(ExitCode.RUNTIME_UNAVAILABLE), "message": f"{type(err).__name__}: {err}"}
    outbox.write(_frame(_ERROR, json.dumps(message).encode()))
    outbox.flush()


def main() -> None:
    outbox = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else printed to stdout goes to stderr, not into the protocol
    _serve(json.loads(sys.argv[1]), sys.stdin.buffer, outbox)


if __name__ == "__main__":
    main()
