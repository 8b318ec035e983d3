"""Which runtimes can run a file, decided from its op inventory (static: nothing is run)."""

from __future__ import annotations

from collections.abc import Sequence

from pe_export.inspection.summary import RuntimeVerdict

FLEX_RUNTIME_HINT = (
    "a TFLite build linked with the Flex delegate (Android: tensorflow-lite-select-tf-ops; "
    "C++: //tensorflow/lite/delegates/flex:delegate); the pip interpreters do not link it"
)


# tflite-runtime's last release: newer TFLite kernels ship only as ai-edge-litert.
TFLITE_RUNTIME_LAST_VERSION = (2, 14, 0)
# int16-activation kernels tflite-runtime 2.14 lacks (measured: a full-integer file fails to prepare there). The
# files' op versions do not say it: ai-edge-quantizer writes version 1, and no runtime table lists int16 RSQRT.
INT16_OPS_PAST_TFLITE_RUNTIME = ("RSQRT",)
MIN_RUNTIME_KEY = "min_runtime_version"  # written by the TFLite converter from the file's op versions


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """ "2.17.0" → (2, 17, 0); None for anything else."""
    parts = (text or "").strip().split(".")
    return tuple(int(p) for p in parts) if parts and all(p.isdigit() for p in parts) else None


def _tflite_runtime_verdict(min_runtime_version: str | None, int16_ops: list[str]) -> RuntimeVerdict:
    last = ".".join(map(str, TFLITE_RUNTIME_LAST_VERSION))
    missing = [name for name in int16_ops if name in INT16_OPS_PAST_TFLITE_RUNTIME]
    if missing:
        return RuntimeVerdict(
            "tflite-runtime",
            False,
            f"int16 activations on {', '.join(missing)}: kernels newer than tflite-runtime {last} (use ai-edge-litert)",
        )
    needed = parse_version(min_runtime_version)
    if needed is None:
        return RuntimeVerdict("tflite-runtime", True, f"builtin ops only; no {MIN_RUNTIME_KEY} to compare with {last}")
    if needed > TFLITE_RUNTIME_LAST_VERSION:
        return RuntimeVerdict(
            "tflite-runtime",
            False,
            f"its ops need TFLite ≥ {min_runtime_version} ({MIN_RUNTIME_KEY}); tflite-runtime ended at {last}: "
            "use ai-edge-litert",
        )
    return RuntimeVerdict("tflite-runtime", True, f"builtin ops only; {MIN_RUNTIME_KEY} {min_runtime_version} ≤ {last}")


def _litert_gpu_verdict(dynamic_inputs: list[str], gpu_risks: list[str]) -> RuntimeVerdict:
    if dynamic_inputs:
        return RuntimeVerdict(
            "litert-gpu",
            False,
            f"the GPU needs fixed input shapes; dynamic: {', '.join(dynamic_inputs)} "
            "(export with --batch and --seq-len)",
        )
    if gpu_risks:
        return RuntimeVerdict(
            "litert-gpu",
            False,
            f"{'; '.join(gpu_risks)}; pe-export tflite --batch N --seq-len L writes neither",
        )
    return RuntimeVerdict(
        "litert-gpu",
        True,
        "fixed shapes; op coverage is per GPU: confirm with `pe-export parity --runtime litert-gpu`",
    )


def tflite_verdicts(
    flex_ops: list[str],
    custom_ops: list[str],
    min_runtime_version: str | None = None,
    dynamic_inputs: list[str] | None = None,
    gpu_risks: list[str] | None = None,
    int16_ops: list[str] | None = None,
) -> list[RuntimeVerdict]:
    if custom_ops:
        reason = f"custom ops {', '.join(custom_ops)} need kernels registered by the application"
        names = ("ai-edge-litert", "tflite-runtime", "tflite+flex", "litert-gpu")
        return [RuntimeVerdict(name, False, reason) for name in names]
    if flex_ops:
        reason = f"needs Flex ops {', '.join(flex_ops)}"
        return [
            RuntimeVerdict("ai-edge-litert", False, reason),
            RuntimeVerdict("tflite-runtime", False, reason),
            RuntimeVerdict("tflite+flex", True, FLEX_RUNTIME_HINT),
            RuntimeVerdict("litert-gpu", False, reason),
        ]
    return [
        RuntimeVerdict("ai-edge-litert", True, "builtin ops only"),
        _tflite_runtime_verdict(min_runtime_version, int16_ops or []),
        RuntimeVerdict("tflite+flex", True, "builtin ops only"),
        _litert_gpu_verdict(dynamic_inputs or [], gpu_risks or []),
    ]


def onnx_verdicts(
    unknown_ops: list[str], custom_domains: list[str], newer: Sequence[str] = (), tensorrt: Sequence[str] = ()
) -> list[RuntimeVerdict]:
    """``newer``: ops that need a recent onnxruntime, each naming the release (``onnx_file.newer_ops``);
    ``tensorrt``: ops that need a recent TensorRT (``onnx_file.tensorrt_ops``)."""
    if unknown_ops:
        reason = f"ops without an ONNX schema: {', '.join(unknown_ops)}"
        return [RuntimeVerdict("onnxruntime", False, reason)]
    notes = "standard ONNX ops" if not custom_domains else f"uses domains {', '.join(custom_domains)}"
    notes += "".join(f"; needs {op}" for op in newer)
    return [
        RuntimeVerdict("onnxruntime", True, f"{notes} (CPU provider)"),
        RuntimeVerdict(
            "onnxruntime-gpu",
            True,
            "CUDA/TensorRT coverage is per op: confirm with `pe-export parity --providers`"
            + "".join(f"; TensorRT needs {op}" for op in tensorrt),
        ),
    ]
