"""Every failure the tool reports, and the one table that maps it to an exit code.

Library code raises these; the CLI prints ``str(error)`` as one line and exits with
``error.exit_code``. Tracebacks are shown only with ``--verbose``.
"""

from __future__ import annotations

import re
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    PARITY_FAILED = 1
    BAD_INPUT = 2
    RUNTIME_UNAVAILABLE = 3
    CONVERSION_FAILED = 4
    NEEDS_FLEX = 5
    INTERNAL_ERROR = 6


# What each exit code means, shown by `pe-export --help` and the README.
EXIT_CODE_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "success (export written and verified, or check passed)",
    ExitCode.PARITY_FAILED: "the exported file does not match the float32 reference within tolerance",
    ExitCode.BAD_INPUT: "bad input: a path, option value, model or bundle that cannot be used as given",
    ExitCode.RUNTIME_UNAVAILABLE: "no installed runtime can run the file, or the runtime crashed",
    ExitCode.CONVERSION_FAILED: "the converter failed or produced an invalid file",
    ExitCode.NEEDS_FLEX: "--builtins-only was given and the model needs select TF (Flex) ops",
    ExitCode.INTERNAL_ERROR: "a bug in pe-export (rerun with --verbose and report the traceback)",
}
# Interruptions exit like shells report them; outputs are never left half-written.
INTERRUPTED_SIGINT, INTERRUPTED_SIGTERM = 130, 143


class PeExportError(Exception):
    """Base class: a one-line message and an exit code."""

    exit_code: ExitCode = ExitCode.BAD_INPUT


class BadInputError(PeExportError):
    """A path, option value or file that cannot be used as given."""

    exit_code = ExitCode.BAD_INPUT


class InputsRejectedError(BadInputError):
    """A runtime refused the inputs it was given for a file. Bad input at `pe-export parity` (a bundle that does
    not fit the file); during an export, whose files run on inputs the SavedModel took, a conversion fault."""


class OutputExistsError(BadInputError):
    """Refusing to replace an existing output without --overwrite."""


class ParityError(PeExportError):
    """The exported model does not match the reference."""

    exit_code = ExitCode.PARITY_FAILED


class RuntimeUnavailableError(PeExportError):
    """A runtime, provider or extra is not installed, cannot run the file, or crashed."""

    exit_code = ExitCode.RUNTIME_UNAVAILABLE


class ConversionError(PeExportError):
    """The converter failed, or wrote a file that does not validate."""

    exit_code = ExitCode.CONVERSION_FAILED


class NeedsFlexError(PeExportError):
    """--builtins-only refused a model that needs select TF ops."""

    exit_code = ExitCode.NEEDS_FLEX


def missing_extra(package: str, extra: str) -> RuntimeUnavailableError:
    """The error raised when an optional backend is not installed."""
    return RuntimeUnavailableError(f"{package} is not installed; install it with: pip install 'pe-export[{extra}]'")


def check_range(flag: str, value: float | None, low: float, high: float, unit: str = "") -> None:
    """The one check of a numeric option: ``value`` (None: not given) must lie in [low, high]."""
    if value is not None and not low <= value <= high:
        raise BadInputError(
            f"{flag} {_number(value)} is out of range; expected {_number(low)} to {_number(high)}{unit}"
        )


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"  # :g would round 1048577 to 1.04858e+06


# Lines of a TensorFlow graph error that say where, not what ("Graph execution error:", its stack's header).
_TF_ERROR_FRAMING = ("Graph execution error", "Detected at node", "<stack traces unavailable>", "[[", "File ")


def one_line(error: BaseException) -> str:
    """An exception's first line that says what went wrong, or its type's name when it has no message (never
    IndexError). A TensorFlow graph error's message follows its framing; the node it names is kept."""
    lines = [re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line.strip()) for line in str(error).splitlines()]
    lines = [line for line in lines if line]
    node = next((m.group(1) for line in lines if (m := re.search(r"\[\[\{\{node ([^}]+)\}\}\]\]", line))), None)
    for line in lines:
        if not line.startswith(_TF_ERROR_FRAMING):
            return f"{line} (at node {node})" if node else line
    return lines[0] if lines else type(error).__name__
