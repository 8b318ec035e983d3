"""How a runtime is asked to run: onnxruntime's providers and LiteRT's GPU precision.

Checked here without importing numpy or any runtime, so that `pe-export parity`'s supervising process
(pe_export/parity/supervisor.py) can refuse a typo at once and stay light.
"""

from __future__ import annotations

from pe_export.errors import BadInputError

PROVIDER_ALIASES = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
}
DEFAULT_PROVIDERS = ("cpu",)

GPU_PRECISIONS = ("fp16", "fp32")
DEFAULT_GPU_PRECISION = "fp16"  # what LiteRT's GPU accelerator does when not told otherwise


def resolve_providers(names: tuple[str, ...] | list[str]) -> list[str]:
    """Short names (tensorrt, cuda, cpu) to onnxruntime provider names, checked for typos."""
    resolved = []
    for name in names:
        key = name.strip().lower()
        if key not in PROVIDER_ALIASES:
            raise BadInputError(f"unknown provider {name!r}; expected one of: {', '.join(PROVIDER_ALIASES)}")
        resolved.append(PROVIDER_ALIASES[key])
    return resolved


def check_tensorrt_modes(providers: tuple[str, ...] | list[str], fp16: bool, int8: bool, cache: object) -> None:
    """TensorRT's options apply to the tensorrt provider: without it they would be ignored in silence."""
    asked = [flag for flag, on in (("--trt-fp16", fp16), ("--trt-int8", int8), ("--trt-cache", cache)) if on]
    if asked and "TensorrtExecutionProvider" not in resolve_providers(providers):
        raise BadInputError(
            f"{' and '.join(asked)} set TensorRT's build; the providers asked ({','.join(providers)}) do not include "
            "tensorrt: pass --providers tensorrt,cuda,cpu or drop them"
        )


def check_gpu_precision(precision: str) -> str:
    if precision not in GPU_PRECISIONS:
        raise BadInputError(f"--gpu-precision {precision!r} is not one of: {', '.join(GPU_PRECISIONS)}")
    return precision
