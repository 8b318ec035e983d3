"""One runner per runtime, all behind the same activate / infer / deactivate interface.

Importing this package registers every runner; each imports its backend lazily on
``activate`` so that a missing optional runtime only matters when it is asked for.
"""

from pe_export.runners import litert, litert_gpu, onnxrt  # noqa: F401  (registration, in preference order)
from pe_export.runners.base import (
    NO_RUNTIME_FIX,
    Runner,
    create_runner,
    first_installed_runner,
    installed_runners,
    resolve_runtime,
    runner_names,
    runner_options,
    runner_options_for,
    runners_for_file,
)

__all__ = [
    "NO_RUNTIME_FIX",
    "Runner",
    "create_runner",
    "first_installed_runner",
    "installed_runners",
    "resolve_runtime",
    "runner_names",
    "runner_options",
    "runner_options_for",
    "runners_for_file",
]
