"""One runner per runtime, all behind the same activate / infer / deactivate interface.

Importing this package registers every runner; each imports its backend lazily on
``activate`` so that a missing optional runtime only matters when it is asked for.
"""

from collections.abc import Callable
from typing import Any

import numpy as np

from pe_export.runners import litert, litert_gpu, onnxrt  # noqa: F401  (registration, in preference order)
from pe_export.runners.base import (
    NO_RUNTIME_FIX,
    Runner,
    RuntimeSettings,
    create_runner,
    first_installed_runner,
    installed_runners,
    resolve_runtime,
    runner_names,
    runner_options,
    runners_for_file,
)
from pe_export.runners.onnxrt import TensorrtBuild, shape_profile
from pe_export.runtime_options import resolve_providers

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


def runner_options_for(
    runtime: str, settings: RuntimeSettings, feeds: Callable[[], list[dict[str, np.ndarray]]] | None = None
) -> dict[str, Any]:
    """runner_options from a command's options: each command asks the runtime the same way. ``feeds`` gives the
    inputs the run will feed, for TensorRT's optimization profile (asked only where TensorRT builds an engine)."""
    tensorrt = None
    if "TensorrtExecutionProvider" in resolve_providers(settings.providers):
        profile = shape_profile(feeds()) if feeds is not None else None
        tensorrt = TensorrtBuild(settings.trt_fp16, settings.trt_int8, settings.trt_cache, profile)
    return runner_options(
        runtime,
        threads=settings.threads,
        providers=settings.providers,
        tf32=settings.tf32,
        gpu_precision=settings.gpu_precision,
        cpu_fallback=settings.cpu_fallback,
        tensorrt=tensorrt,
    )
