"""Every precision pe-export writes, one object each: what it is, what runs it, how it is made and judged.

The CLI's choices, the option checks, the memory estimate and both converters ask these objects; no other module
compares a ``--quantize`` string. A new precision is one conversion step (a function in its own module) and one
``register(Precision(...))`` below (docs/development.md walks through it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pe_export.errors import BadInputError, missing_extra

FORMATS = ("tflite", "onnx")


@dataclass(frozen=True)
class Precision:
    """One ``--quantize`` choice of one format."""

    name: str  # the --quantize value
    file_format: str  # "tflite" or "onnx"
    judged_at: str  # the parity tolerance it is judged at (parity/tolerances.py): fp32, fp16 or int8
    runtimes: tuple[str, ...]  # runtimes (and providers) that run the file as it is meant to run
    summary: str  # one line for --help and the docs
    plain: bool = False  # the conversion as it is: float32, nothing chosen or quantized
    decides: bool = False  # chooses by accuracy on samples (kept apart from those that judge it: holdout.py)
    chooser: str = "int8"  # what makes the choices, as the notes name it
    calibrates: bool = False  # reads samples whether verified or not (activation ranges, value peaks)
    keep_float: str | None = None  # what --keep-float names for it (None: not taken)
    keep_int16: bool = False  # --keep-int16 (activations kept int16) applies
    outliers: bool = False  # --outlier-channels (channels computed in float beside the int8 products) applies
    int8_kernels: bool = False  # --int8-kernel (which integer products) applies
    holds_second_copy: bool = False  # the export holds a quantized model beside the float one (memory estimate)
    # TFLite's 2 GiB: the largest file it writes per float32 weight byte (dynamic-int8's search reads the float32
    # file of the same graph beside its int8 one)
    stored_bytes_per_weight_byte: float = 1.0
    # TFLite: the converter's settings, and how the file is made
    converter_types: tuple[str, ...] = ()  # TFLiteConverter target_spec.supported_types (float16)
    converter_optimizes: bool = False  # Optimize.DEFAULT: the converter quantizes the weights
    integer_kernels: bool = False  # full integer: a representative dataset, int8 kernels first
    converter_external_buffers: bool = False  # the converter's own conversion may go past 2 GiB (buffers by offset)
    from_float_file: bool = False  # made from the float32 file in this process, not by the converter
    edits_converter_file: bool = False  # its search edits the converter's file with the float32 file beside it
    # ONNX: the step that turns the float32 model into this precision: "module:function", imported when used
    step: str | None = None

    @property
    def searches(self) -> bool:
        """Whether a search runs candidate files (--keep-float steers it): an ONNX one runs the model from bytes in
        onnxruntime, so it stops at 2 GiB (memory.check_onnx_size)."""
        return self.keep_float is not None

    def step_function(self) -> Callable[..., Any] | None:
        """The conversion step, imported now; its ImportError names the extra to install."""
        if self.step is None:
            return None
        module, _, function = self.step.partition(":")
        try:
            step: Callable[..., Any] = getattr(importlib.import_module(module), function)
            return step
        except ImportError as err:
            raise missing_extra(err.name or module, "convert") from err


_PRECISIONS: dict[tuple[str, str], Precision] = {}


def register(precision: Precision) -> Precision:
    key = (precision.file_format, precision.name)
    if precision.file_format not in FORMATS or key in _PRECISIONS:
        raise ValueError(f"precision {key} is registered twice or for an unknown format")
    _PRECISIONS[key] = precision
    return precision


def names(file_format: str) -> tuple[str, ...]:
    """The --quantize choices of ``file_format``, in registration order."""
    return tuple(name for (fmt, name) in _PRECISIONS if fmt == file_format)


def all_precisions(file_format: str | None = None) -> list[Precision]:
    """Every precision (of ``file_format``), in registration order."""
    return [p for p in _PRECISIONS.values() if file_format in (None, p.file_format)]


def precision(file_format: str, name: str) -> Precision:
    """The precision ``name`` of ``file_format``; an unknown one is a one-line error listing the known ones."""
    found = _PRECISIONS.get((file_format, name))
    if found is None:
        raise BadInputError(
            f"--quantize {name!r} is not available for {file_format}; expected one of: {', '.join(names(file_format))}"
        )
    return found


def judged_at(name: str) -> str:
    """The tolerance ``name`` is judged at (the same in both formats that have it)."""
    return next(p.judged_at for p in _PRECISIONS.values() if p.name == name)


# TFLite: LiteRT's CPU kernels (XNNPACK) and its GPU accelerator; full integer is the file NPU delegates take.
register(
    Precision(
        "none",
        "tflite",
        "fp32",
        ("litert", "litert-gpu"),
        "float32",
        plain=True,
        converter_external_buffers=True,
    )
)
register(
    Precision(
        "float16",
        "tflite",
        "fp16",
        ("litert", "litert-gpu"),
        "float16 weights (a CPU computes in float32, a GPU in float16)",
        converter_types=("float16",),
        converter_optimizes=True,
        stored_bytes_per_weight_byte=0.5,
        converter_external_buffers=True,
    )
)
register(
    Precision(
        "dynamic-int8",
        "tflite",
        "int8",
        ("litert",),
        "int8 weights, activations quantized per call; the weights its search keeps float",
        decides=True,
        keep_float="weights kept float",
        holds_second_copy=True,
        converter_optimizes=True,
        edits_converter_file=True,
    )
)
register(
    Precision(
        "int8",
        "tflite",
        "int8",
        ("litert",),
        "full integer (int8 or int16 activations by measured error), for NPUs",
        decides=True,
        calibrates=True,
        keep_float="ops left float",
        keep_int16=True,
        holds_second_copy=True,
        stored_bytes_per_weight_byte=0.25,
        integer_kernels=True,
        from_float_file=True,
    )
)

# ONNX: onnxruntime's CPU and CUDA providers and TensorRT (which takes no com.microsoft op).
_ONNX = "pe_export.converters.onnx.precisions"
register(Precision("none", "onnx", "fp32", ("onnxruntime-cpu", "onnxruntime-cuda", "tensorrt"), "float32", plain=True))
register(
    Precision(
        "float16",
        "onnx",
        "fp16",
        ("onnxruntime-cpu", "onnxruntime-cuda", "tensorrt"),
        "float16 arithmetic, float32 islands where the values need them",
        decides=True,
        chooser="float16",
        calibrates=True,
        keep_float="nodes kept float32",
        holds_second_copy=True,
        step=f"{_ONNX}:float16_arithmetic",
    )
)
register(
    Precision(
        "weight-float16",
        "onnx",
        "fp16",
        ("onnxruntime-cpu", "onnxruntime-cuda", "tensorrt"),
        "float16 weights cast to float32 (float32 arithmetic, half the weight bytes)",
        step=f"{_ONNX}:float16_storage",
    )
)
register(
    Precision(
        "dynamic-int8",
        "onnx",
        "int8",
        ("onnxruntime-cpu",),
        "int8 products with activations quantized per call (--int8-kernel); the weights its search keeps float",
        decides=True,
        keep_float="weights kept float",
        outliers=True,
        int8_kernels=True,
        holds_second_copy=True,
        step=f"{_ONNX}:dynamic_int8",
    )
)
register(
    Precision(
        "int8",
        "onnx",
        "int8",
        ("onnxruntime-cpu", "onnxruntime-cuda", "tensorrt"),
        "static int8 in QDQ form, ranges calibrated on the inputs (TensorRT int8)",
        decides=True,
        calibrates=True,
        keep_float="nodes kept float",
        outliers=True,
        holds_second_copy=True,
        step=f"{_ONNX}:static_int8",
    )
)
register(
    Precision(
        "weight-int8",
        "onnx",
        "int8",
        ("onnxruntime-cpu", "onnxruntime-cuda"),
        "int8 weights with block scales, dequantized when loaded (float32 arithmetic: judged as int8, far closer)",
        holds_second_copy=True,
        step=f"{_ONNX}:weight_int8",
    )
)
