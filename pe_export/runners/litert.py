"""TFLite runners: ai-edge-litert, tflite-runtime (fallback), and TensorFlow's own interpreter."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from pe_export.errors import BadInputError, InputsRejectedError, RuntimeUnavailableError, missing_extra, one_line
from pe_export.native import capture_native_output
from pe_export.runners.base import NO_RUNTIME_FIX, Runner, register_runner
from pe_export.specs import TensorSpec

FLEX_MESSAGE_MARKER = "Select TensorFlow op"
OLD_KERNELS_MARKER = "Didn't find op for builtin opcode"  # the file's op version is newer than the runtime
OUT_OF_RANGE_MARKER = "builtin_code out of range"  # an op code the runtime does not know at all
UNSUPPORTED_TYPE_MARKER = "is unsupported by op"  # a kernel without that type (int16 RSQRT in TFLite 2.14)


class _TFLiteRunner(Runner):
    """Shared logic; subclasses name the module that provides ``Interpreter``."""

    module: str = ""
    package: str = ""
    extra: str = ""
    current_kernels = True  # ships the converter's own op versions (ai-edge-litert, TensorFlow's interpreter)

    exposes_intermediates = True

    def __init__(
        self,
        *args: Any,
        signature: str | None = None,
        preserve_tensors: bool = False,
        serialized: bytes | None = None,
        **kwargs: Any,
    ) -> None:
        """``preserve_tensors``: keep every intermediate tensor readable after ``infer`` (``tapped``). The
        interpreter then runs its builtin kernels without the default XNNPACK delegate, whose fused partitions
        keep no intermediate: the same ops in float32, not the same kernels. ``serialized``: the file's bytes,
        for a file that exists only in memory (as for onnxruntime); ``model_path`` then only names it."""
        super().__init__(*args, **kwargs)
        self.signature = signature
        self.preserve_tensors = preserve_tensors
        self.serialized = serialized
        self._interpreter: Any = None
        self._signature_runner: Any = None
        self._output_details: dict[str, Any] = {}  # each output's quantization, read once: infer is what bench times
        self._invoked = False

    def interpreter_class(self) -> Any:
        try:
            return importlib.import_module(self.module).Interpreter
        except ImportError as err:
            raise missing_extra(self.package, self.extra) from err

    def resolver_types(self) -> Any:
        return importlib.import_module(self.module).OpResolverType

    def activate(self) -> None:
        interpreter_class = self.interpreter_class()
        try:
            # The interpreter announces its XNNPACK delegate on fd 2; keep reports clean.
            with capture_native_output():
                model = (
                    {"model_path": str(self.model_path)}
                    if self.serialized is None
                    else {"model_content": self.serialized}
                )
                self._interpreter = interpreter_class(**model, num_threads=self.threads, **self._tap_options())
            signatures = self._interpreter.get_signature_list()
        except ValueError as err:
            raise self._load_error(err) from err
        except SystemError as err:  # an extension built for NumPy 1.x, loaded beside NumPy 2
            if int(np.__version__.split(".")[0]) < 2:
                raise
            raise RuntimeUnavailableError(
                f"{self.name} cannot load models here: it was built for NumPy 1.x and NumPy {np.__version__} is "
                f"installed; pip install 'numpy<2' (pip install 'pe-export[{self.extra}]' pins it), or use litert"
            ) from err
        if not signatures:
            raise BadInputError(
                f"{self.model_path.name} has no signature; expected a TFLite file with a signature def "
                "(export it with pe-export or TFLiteConverter.from_saved_model)"
            )
        key = self.signature or next(iter(signatures))
        if key not in signatures:
            raise BadInputError(f"signature {key!r} is not in {self.model_path.name}; it has: {', '.join(signatures)}")
        self._signature_runner = self._interpreter.get_signature_runner(key)
        self._output_details = self._signature_runner.get_output_details()

    def _load_error(self, err: Exception) -> Exception:
        text = one_line(err)
        if FLEX_MESSAGE_MARKER in str(err):
            return RuntimeUnavailableError(
                f"{self.name} cannot run {self.model_path.name}: it contains select TF (Flex) ops; "
                "run it with a Flex-linked TFLite build (see `pe-export inspect`)"
            )
        if OLD_KERNELS_MARKER in str(err) or OUT_OF_RANGE_MARKER in str(err) or UNSUPPORTED_TYPE_MARKER in str(err):
            if self.current_kernels:  # the newest kernels there are: an op they lack means the bytes are wrong
                return BadInputError(
                    f"{self.model_path.name} looks damaged: {self.name}, which runs every op the converter writes, "
                    f"cannot register one of its ops ({text}); re-export or copy it again (a file from a converter "
                    "newer than this runtime reads the same: `pe-export inspect` lists its ops and versions)"
                )
            return RuntimeUnavailableError(
                f"{self.name} is older than {self.model_path.name}'s ops ({text}); run it with ai-edge-litert "
                f"({NO_RUNTIME_FIX}), or see min_runtime_version in `pe-export inspect`"
            )
        return BadInputError(f"{self.name} could not load {self.model_path.name}: {text}")

    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._signature_runner is None:
            raise RuntimeError("activate() the runner before infer()")
        try:
            # XNNPACK is applied, and announced on fd 2, at the first invocation.
            with capture_native_output(enabled=not self._invoked):
                outputs = self._signature_runner(**feed)
            self._invoked = True
        except (ValueError, RuntimeError) as err:  # the interpreter raises both for bad shapes
            message = one_line(err)
            if FLEX_MESSAGE_MARKER in str(err) or (UNSUPPORTED_TYPE_MARKER in str(err) and not self.current_kernels):
                raise self._load_error(err) from err
            raise InputsRejectedError(f"{self.name} rejected the inputs: {message}") from err
        # An integer output (a full-integer file's before its last DEQUANTIZE) as the real numbers it stands for
        return {name: real_value(self._output_details[name], np.array(value)) for name, value in outputs.items()}

    def _tap_options(self) -> dict[str, Any]:
        if not self.preserve_tensors:
            return {}
        resolver = self.resolver_types()
        return {
            "experimental_preserve_all_tensors": True,
            "experimental_op_resolver_type": resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        }

    def tapped(self, names: list[str] | None = None) -> dict[str, np.ndarray]:
        if not self.preserve_tensors or not self._invoked:
            raise RuntimeError("tapped() needs a runner made with preserve_tensors=True, after infer()")
        details = self._interpreter.get_tensor_details()
        first: dict[str, dict[str, Any]] = {}  # a name the converter gave two tensors: the first one
        for detail in details:
            first.setdefault(detail["name"], detail)
        wanted = names if names is not None else [d["name"] for d in first.values() if _is_activation(d)]
        values = {}
        for name in wanted:
            detail = first.get(name)
            if detail is not None:
                try:
                    values[name] = real_value(detail, np.array(self._interpreter.get_tensor(detail["index"])))
                except ValueError:  # a tensor the interpreter never allocated (a folded constant's)
                    continue
        return values

    def input_specs(self) -> list[TensorSpec]:
        return _specs(self._signature_runner.get_input_details())

    def output_specs(self) -> list[TensorSpec]:
        return _specs(self._signature_runner.get_output_details())

    def output_names(self) -> list[str]:
        return list(self._signature_runner.get_output_details())

    def deactivate(self) -> None:
        self._signature_runner = None
        self._interpreter = None


def real_value(detail: dict[str, Any], value: np.ndarray) -> np.ndarray:
    """A quantized tensor as the real numbers it stands for, scale · (q − zero point); others as they are."""
    scale, zero_point = detail.get("quantization", (0.0, 0))
    if value.dtype.kind in "iu" and value.dtype.itemsize <= 2 and scale > 0:
        return ((value.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)).astype(np.float32)
    return value


def _is_activation(detail: dict[str, Any]) -> bool:
    """A float tensor of rank 2 or more: an activation candidate. Tensors named after a variable read (weights) are
    skipped only to save comparisons: a tensor maps to a layer by its values (layers/mapping.py), never its name."""
    return (
        np.dtype(detail["dtype"]).kind == "f" and len(detail["shape"]) >= 2 and "ReadVariableOp" not in detail["name"]
    )


def _specs(details: dict[str, Any]) -> list[TensorSpec]:
    """A signature runner's tensor details as specs; -1 in the shape signature is a dynamic axis."""
    specs = []
    for name, detail in details.items():
        signature = detail.get("shape_signature", detail["shape"])
        specs.append(
            TensorSpec(name, np.dtype(detail["dtype"]).name, tuple(None if int(d) < 0 else int(d) for d in signature))
        )
    return specs


@register_runner("litert", (".tflite",))
class LiteRTRunner(_TFLiteRunner):
    backend_module = "ai_edge_litert"
    module = "ai_edge_litert.interpreter"
    package = "ai-edge-litert"
    extra = "device"


@register_runner("tflite-runtime", (".tflite",))
class TFLiteRuntimeRunner(_TFLiteRunner):
    backend_module = "tflite_runtime"
    module = "tflite_runtime.interpreter"
    package = "tflite-runtime"
    extra = "tflite-runtime"
    current_kernels = False  # frozen at TF 2.14: newer files really can need newer kernels


@register_runner("tflite-tf", (".tflite",))
class TensorFlowLiteRunner(_TFLiteRunner):
    backend_module = "tensorflow"
    module = "tensorflow.lite"
    package = "tensorflow"
    extra = "convert"

    def interpreter_class(self) -> Any:
        from pe_export.native import import_tensorflow

        return import_tensorflow().lite.Interpreter  # tf.lite is a lazy attribute, not an importable module

    def resolver_types(self) -> Any:
        from pe_export.native import import_tensorflow

        return import_tensorflow().lite.experimental.OpResolverType
