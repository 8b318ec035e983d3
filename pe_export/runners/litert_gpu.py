"""LiteRT on the GPU: ai-edge-litert's CompiledModel API with its GPU accelerator (WebGPU over Vulkan).

This is how a .tflite runs on a Jetson's or a desktop's GPU today. Three facts shape the runner:
- GPU accelerators compute in float16 unless told otherwise (``--gpu-precision fp32`` sets
  ``enforce_f32``), so the default is judged by the float16 tolerance and every report says which ran.
- Ops the GPU lacks (an embedding GATHER with 2-D indices, say) make the compile fail unless the CPU
  is allowed to take them (``--cpu-fallback``); the report lists what fell back.
- TensorFlow must not be loaded in the same process: it exports thousands of unversioned LLVM symbols
  that Mesa's LLVM-based drivers bind to, and creating the Vulkan device crashes. Parity and bench run
  runners in a TF-free child process by default; in-process use in a TF process is refused.
Inputs need fixed shapes (the GPU graph is built once); export with ``--batch N --seq-len L``.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any, ClassVar

import numpy as np

from pe_export.errors import BadInputError, RuntimeUnavailableError, missing_extra, one_line
from pe_export.native import capture_native_output
from pe_export.runners.base import Runner, register_runner
from pe_export.runtime_options import DEFAULT_GPU_PRECISION, check_gpu_precision
from pe_export.specs import TensorSpec

SOFTWARE_VULKAN_HINT = "targets/software-vulkan/setup.sh gives a machine without a GPU a software one"

_UNSUPPORTED = re.compile(r"^([A-Z][A-Z0-9_]+):\s*(.*)$")
_LOG_LEVELS = {"INFO", "WARNING", "ERROR", "VERBOSE", "DEBUG"}
_PARTITION = re.compile(r"(\d+) operations will run on the GPU, and the remaining (\d+) operations will run on the CPU")
_ADAPTER = re.compile(r"Selected adapter: ([^,(]+)")
_NO_ADAPTER_MARKERS = ("No adapters found", "Failed to initialize WebGPU environment", "Couldn't load Vulkan")


def gpu_log_summary(log: str) -> dict[str, Any]:
    """What the GPU accelerator said while compiling: adapter, op partition, unsupported ops."""
    unsupported: dict[str, str] = {}
    marker = "not supported by GPU delegate:"
    if marker in log:  # one "OP: reason" line per op, up to the first line that is not one
        for line in log.split(marker, 1)[1].strip().splitlines():
            listed = _UNSUPPORTED.match(line.strip())
            if not listed or listed.group(1) in _LOG_LEVELS:
                break
            unsupported.setdefault(listed.group(1), listed.group(2).strip() or "not supported")
    partition = _PARTITION.search(log)
    adapter = _ADAPTER.search(log)
    return {
        "adapter": adapter.group(1).strip() if adapter else None,
        "gpu_ops": int(partition.group(1)) if partition else None,
        "cpu_ops": int(partition.group(2)) if partition else None,
        "unsupported": unsupported,
        "no_adapter": any(m in log for m in _NO_ADAPTER_MARKERS),
    }


@register_runner("litert-gpu", (".tflite",))
class LiteRTGpuRunner(Runner):
    backend_module = "ai_edge_litert"
    option_names: ClassVar[tuple[str, ...]] = ("gpu_precision", "cpu_fallback")
    only_when_asked = True  # never the default runtime: it needs a GPU (or a software Vulkan)

    def __init__(
        self,
        *args: Any,
        gpu_precision: str = DEFAULT_GPU_PRECISION,
        cpu_fallback: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.gpu_precision = check_gpu_precision(gpu_precision)
        self.cpu_fallback = cpu_fallback
        self.compile_log: dict[str, Any] = {}
        self._model: Any = None
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []
        self._signature_key = ""
        self._buffers: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        self._description = ""

    @classmethod
    def arithmetic_precision(cls, options: dict[str, Any]) -> str | None:
        return options.get("gpu_precision", DEFAULT_GPU_PRECISION)

    @classmethod
    def arithmetic_remedy(cls, options: dict[str, Any]) -> str | None:
        return (
            "LiteRT's GPU accelerator has no per-op precision: --gpu-precision fp32 computes every op in fp32 "
            "and checks the file itself"
        )

    def activate(self) -> None:
        if "tensorflow" in sys.modules:
            raise RuntimeUnavailableError(
                "litert-gpu cannot start in a process that has loaded TensorFlow (its LLVM symbols crash Vulkan "
                "drivers); run it in its own process (parity and bench do unless given --no-isolate)"
            )
        try:
            from ai_edge_litert.compiled_model import CompiledModel
            from ai_edge_litert.cpu_options import CpuOptions
            from ai_edge_litert.gpu_options import GpuOptions
            from ai_edge_litert.hardware_accelerator import HardwareAccelerator
            from ai_edge_litert.options import Options
        except ImportError as err:
            raise missing_extra("ai-edge-litert (2.3 or newer, with CompiledModel)", "device") from err
        self._read_signature()
        accelerators = HardwareAccelerator.GPU | (HardwareAccelerator.CPU if self.cpu_fallback else 0)
        options = Options(
            hardware_accelerators=accelerators,
            gpu_options=GpuOptions(enforce_f32=self.gpu_precision == "fp32"),
            cpu_options=CpuOptions(num_threads=self.threads or 1),
        )
        with capture_native_output() as captured:
            try:
                self._model = CompiledModel.from_file(str(self.model_path), options=options)
                error: Exception | None = None
            except RuntimeError as err:
                error = err
        self.compile_log = gpu_log_summary(captured.text)
        if error is not None:
            raise self._compile_error(error)
        self._signature_key, self._buffers = buffers_by_name(self._model, self._inputs, self._outputs)
        self._description = self._describe_compiled(self._model.is_fully_accelerated())

    def _read_signature(self) -> None:
        """Names, dtypes and shapes of the first signature, read by the CPU interpreter (which keeps -1 dims
        and says what is wrong with a file it cannot load)."""
        from pe_export.runners.litert import LiteRTRunner

        reader = LiteRTRunner(self.model_path)
        reader.activate()
        try:
            self._inputs, self._outputs = reader.input_specs(), reader.output_specs()
        finally:
            reader.deactivate()
        dynamic = [spec.describe() for spec in self._inputs if None in spec.shape]
        if dynamic:
            raise BadInputError(
                f"litert-gpu needs fixed input shapes; {self.model_path.name} takes {', '.join(dynamic)}: export it "
                "with --batch N --seq-len L (and make the golden bundle with the same --batch and --seq-len)"
            )
        dynamic = [spec.describe() for spec in self._outputs if None in spec.shape]
        if dynamic:
            raise BadInputError(
                f"litert-gpu needs fixed output shapes; {self.model_path.name} gives {', '.join(dynamic)} at fixed "
                "inputs (an output sized by the data); run it on the CPU runtimes (--runtime litert)"
            )

    def _compile_error(self, err: Exception) -> RuntimeUnavailableError:
        log = self.compile_log
        if log["no_adapter"]:
            return RuntimeUnavailableError(
                "litert-gpu found no GPU: no Vulkan adapter (is libvulkan.so.1 and a driver's ICD installed?); "
                + SOFTWARE_VULKAN_HINT
            )
        if log["unsupported"] and not self.cpu_fallback:
            ops = "; ".join(f"{op}: {why}" for op, why in log["unsupported"].items())
            return RuntimeUnavailableError(
                f"the GPU cannot run every op of {self.model_path.name} ({ops}); pass --cpu-fallback to run those "
                "ops on the CPU (the report lists them)"
            )
        return RuntimeUnavailableError(f"litert-gpu could not compile {self.model_path.name}: {one_line(err)}")

    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._model is None:
            raise RuntimeError("activate() the runner before infer()")
        inputs, outputs = self._buffers
        for spec in self._inputs:
            buffer = inputs[spec.name]
            if spec.name not in feed:
                raise BadInputError(f"litert-gpu needs input {spec.name!r}; got {', '.join(feed)}")
            value = np.ascontiguousarray(feed[spec.name], dtype=spec.dtype)
            if value.shape != spec.shape:
                raise BadInputError(
                    f"litert-gpu runs {self.model_path.name} at fixed shapes: input {spec.name!r} is "
                    f"{list(value.shape)}, the file takes {list(spec.shape)}"
                )
            buffer.write(value)
        try:
            self._model.run_by_name(self._signature_key, inputs, outputs)
        except RuntimeError as err:
            raise RuntimeUnavailableError(f"litert-gpu failed to run {self.model_path.name}: {one_line(err)}") from err
        result = {}
        for spec in self._outputs:  # every output's shape is fixed (checked at activation)
            values = outputs[spec.name].read(math.prod(d or 0 for d in spec.shape), np.dtype(spec.dtype))
            result[spec.name] = values.reshape(spec.shape)
        return result

    def input_specs(self) -> list[TensorSpec]:
        return list(self._inputs)

    def output_names(self) -> list[str]:
        return [spec.name for spec in self._outputs]

    def describe(self) -> str:
        return self._description or f"litert-gpu[{self.gpu_precision} math]"

    def _describe_compiled(self, fully_accelerated: bool) -> str:
        log = self.compile_log
        parts = [f"{self.gpu_precision} math"]
        if log.get("adapter"):
            parts.append(str(log["adapter"]))
        if fully_accelerated:
            parts.append("fully accelerated")
        else:
            fell_back = ",".join(log.get("unsupported") or {}) or "some ops"
            parts.append(f"GPU {log.get('gpu_ops') or '?'} ops, CPU {log.get('cpu_ops') or '?'}: {fell_back}")
        return f"litert-gpu[{'; '.join(parts)}]"

    def deactivate(self) -> None:
        self._buffers = ({}, {})
        self._model = None


def buffers_by_name(model: Any, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> tuple[str, tuple[dict, dict]]:
    """The first signature's key, and a buffer for each input and output bound by its name. The CPU
    interpreter's signature lists names sorted; CompiledModel keeps the file's order: zipping the two by
    position swapped inputs of a file whose signature is not sorted."""
    key = str(model.get_signature_by_index(0)["key"])
    return key, (
        {spec.name: model.create_input_buffer_by_name(key, spec.name) for spec in inputs},
        {spec.name: model.create_output_buffer_by_name(key, spec.name) for spec in outputs},
    )
