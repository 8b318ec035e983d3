"""Which runtimes can run a file, decided from its op inventory (static: nothing is run)."""

from __future__ import annotations

from pe_export.inspection.summary import RuntimeVerdict

FLEX_RUNTIME_HINT = (
    "a TFLite build linked with the Flex delegate (Android: tensorflow-lite-select-tf-ops; "
    "C++: //tensorflow/lite/delegates/flex:delegate); the pip interpreters do not link it"
)


def tflite_verdicts(flex_ops: list[str], custom_ops: list[str]) -> list[RuntimeVerdict]:
    if custom_ops:
        reason = f"custom ops {', '.join(custom_ops)} need kernels registered by the application"
        return [RuntimeVerdict(name, False, reason) for name in ("ai-edge-litert", "tflite-runtime", "tflite+flex")]
    if flex_ops:
        reason = f"needs Flex ops {', '.join(flex_ops)}"
        return [
            RuntimeVerdict("ai-edge-litert", False, reason),
            RuntimeVerdict("tflite-runtime", False, reason),
            RuntimeVerdict("tflite+flex", True, FLEX_RUNTIME_HINT),
        ]
    return [
        RuntimeVerdict("ai-edge-litert", True, "builtin ops only"),
        RuntimeVerdict(
            "tflite-runtime", True, "builtin ops only; 2.14 (2023) may refuse op versions newer than its kernels"
        ),
        RuntimeVerdict("tflite+flex", True, "builtin ops only"),
    ]


def onnx_verdicts(unknown_ops: list[str], custom_domains: list[str]) -> list[RuntimeVerdict]:
    if unknown_ops:
        reason = f"ops without an ONNX schema: {', '.join(unknown_ops)}"
        return [RuntimeVerdict("onnxruntime", False, reason)]
    notes = "standard ONNX ops" if not custom_domains else f"uses domains {', '.join(custom_domains)}"
    return [
        RuntimeVerdict("onnxruntime", True, f"{notes} (CPU provider)"),
        RuntimeVerdict(
            "onnxruntime-gpu", True, "CUDA/TensorRT coverage is per op: confirm with `pe-export parity --providers`"
        ),
    ]
