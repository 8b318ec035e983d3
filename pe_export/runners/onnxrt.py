"""onnxruntime runner with explicit execution providers (never a silent CPU fallback)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pe_export.errors import BadInputError, InputsRejectedError, RuntimeUnavailableError, missing_extra, one_line
from pe_export.inspection.onnx_file import too_new_for
from pe_export.runners.base import Runner, register_runner
from pe_export.runtime_options import DEFAULT_PROVIDERS, PROVIDER_ALIASES, resolve_providers
from pe_export.specs import TensorSpec

# From Ampere on (Orin included) CUDA runs float32 matmuls in TF32 by default, rounding their
# inputs to 10 mantissa bits (~1e-3 relative): a float32 file no longer computes float32. Parity
# and bench keep it off unless asked (like Polygraphy's --tf32): CUDA through its provider
# option, TensorRT (which builds FP32 layers with TF32 by default) through NVIDIA's variable.
TF32_ENV = "NVIDIA_TF32_OVERRIDE"

_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}


# TensorRT's optimization profile: each input's (min, opt, max) shape, from the shapes the run will feed.
ShapeProfile = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


@dataclass(frozen=True)
class TensorrtBuild:
    """How TensorRT builds its engine (TensorrtExecutionProvider's options): the precisions its layers may take
    besides float32, where engines and timing data are cached between sessions, and the optimization profile."""

    fp16: bool = False
    int8: bool = False  # the file's Q/DQ scales (a static int8 ONNX); no calibration table
    cache: str | None = None
    profile: ShapeProfile | None = None

    def provider_options(self) -> dict[str, str]:
        options = {"trt_fp16_enable": _flag(self.fp16), "trt_int8_enable": _flag(self.int8)}
        if self.int8:
            options["trt_int8_use_native_calibration_table"] = "0"
        if self.cache:  # an engine build takes minutes on a Jetson: parity's and bench's sessions share one
            options.update(
                trt_engine_cache_enable="1",
                trt_engine_cache_path=self.cache,
                trt_timing_cache_enable="1",
                trt_timing_cache_path=self.cache,
            )
        if self.profile:
            for index, bound in enumerate(("min", "opt", "max")):
                options[f"trt_profile_{bound}_shapes"] = ",".join(
                    f"{name}:{'x'.join(str(d) for d in shapes[index])}" for name, shapes in sorted(self.profile.items())
                )
        return options

    def describe(self) -> str:
        modes = [mode for mode, on in (("trt-fp16", self.fp16), ("trt-int8", self.int8)) if on]
        return "".join(f" {mode}" for mode in modes) + (" engine-cache" if self.cache else "")


def _flag(on: bool) -> str:
    return "1" if on else "0"


def shape_profile(feeds: list[dict[str, np.ndarray]]) -> ShapeProfile:
    """Each input's smallest and largest shape over ``feeds`` (opt: the largest, what the timed calls run)."""
    profile: ShapeProfile = {}
    for feed in feeds:
        for name, value in feed.items():
            shape = tuple(int(d) for d in np.shape(value))
            low, _, high = profile.get(name, (shape, shape, shape))
            low = tuple(min(a, b) for a, b in zip(low, shape, strict=True))
            high = tuple(max(a, b) for a, b in zip(high, shape, strict=True))
            profile[name] = (low, high, high)
    return profile


def session_providers(
    providers: list[str], tf32: bool, tensorrt: TensorrtBuild | None = None
) -> list[str | tuple[str, dict[str, str]]]:
    """The providers argument of InferenceSession: names, with CUDA's TF32 switch and TensorRT's build set."""
    result: list[str | tuple[str, dict[str, str]]] = []
    for provider in providers:
        if provider == "CUDAExecutionProvider":
            result.append((provider, {"use_tf32": "1" if tf32 else "0"}))
        elif provider == "TensorrtExecutionProvider":
            result.append((provider, (tensorrt or TensorrtBuild()).provider_options()))
        else:
            result.append(provider)
    return result


@register_runner("onnxruntime", (".onnx",))
class OnnxRuntimeRunner(Runner):
    backend_module = "onnxruntime"
    option_names: ClassVar[tuple[str, ...]] = ("providers", "tf32", "tensorrt")

    def __init__(
        self,
        *args: Any,
        providers: tuple[str, ...] = DEFAULT_PROVIDERS,
        tf32: bool = False,
        tensorrt: TensorrtBuild | None = None,
        serialized: bytes | None = None,
        preserve_tensors: bool = False,
        **kwargs: Any,
    ) -> None:
        """``serialized``: the model's bytes, for a model that exists only in memory (the int8 search's
        candidates); ``model_path`` then only names it. ``preserve_tensors``: every node's output is also a
        graph output, read back by ``tapped`` (the same graph and kernels: onnxruntime only keeps the values)."""
        super().__init__(*args, **kwargs)
        self.providers = resolve_providers(providers)
        self.tf32 = tf32
        self.tensorrt = tensorrt or TensorrtBuild()
        self.serialized = serialized
        self.preserve_tensors = preserve_tensors
        self._session: Any = None
        self._outputs: list[str] = []
        self._last: dict[str, np.ndarray] = {}

    def activate(self) -> None:
        try:
            import onnxruntime as ort
        except ImportError as err:
            raise missing_extra("onnxruntime", "device") from err
        available = ort.get_available_providers()
        missing = [p for p in self.providers if p not in available]
        if missing:
            raise RuntimeUnavailableError(
                f"provider(s) {', '.join(missing)} not available in this onnxruntime "
                f"(available: {', '.join(available)}); install onnxruntime-gpu for cuda/tensorrt "
                "or pass --providers cpu"
            )
        if "TensorrtExecutionProvider" in self.providers and self.tensorrt.cache:
            try:
                Path(self.tensorrt.cache).mkdir(parents=True, exist_ok=True)
            except OSError as err:
                reason = err.strerror or err
                raise BadInputError(f"--trt-cache {self.tensorrt.cache}: cannot make the folder ({reason})") from None
        if "TensorrtExecutionProvider" in self.providers and not self.tf32:
            # Read when TensorRT builds the engine; a value the user set wins. Parity runs this in
            # its own child process, so only --no-isolate leaves it set in the caller's process.
            os.environ.setdefault(TF32_ENV, "0")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if self.threads:
            options.intra_op_num_threads = self.threads
        model: str | bytes = str(self.model_path) if self.serialized is None else self.serialized
        too_new = too_new_for(model, ort.__version__)
        if too_new is not None:
            raise RuntimeUnavailableError(f"onnxruntime cannot run {self.model_path.name}: {too_new}")
        if self.preserve_tensors:
            model = self._with_every_value_an_output()
        try:
            self._session = ort.InferenceSession(
                model,
                sess_options=options,
                providers=session_providers(self.providers, self.tf32, self.tensorrt),
            )
        except Exception as err:  # onnxruntime raises its own exception types per failure
            first_line = one_line(err)
            raise BadInputError(f"onnxruntime could not load {self.model_path.name}: {first_line}") from err
        active = self._session.get_providers()
        dropped = [p for p in self.providers if p not in active]
        if dropped:
            raise RuntimeUnavailableError(
                f"onnxruntime could not start provider(s) {', '.join(dropped)} (active: {', '.join(active)})"
            )

    def _with_every_value_an_output(self) -> bytes:
        """The model with each node's output listed as a graph output too (onnx package: the device extra)."""
        try:
            import onnx
        except ImportError as err:
            raise missing_extra("onnx", "device") from err
        model = onnx.load_from_string(self.serialized) if self.serialized else onnx.load(str(self.model_path))
        self._outputs = [output.name for output in model.graph.output]
        listed = set(self._outputs) | {i.name for i in model.graph.input}
        for node in model.graph.node:
            for name in node.output:
                if name and name not in listed:
                    model.graph.output.append(onnx.ValueInfoProto(name=name))  # typed by onnxruntime
                    listed.add(name)
        return bytes(model.SerializeToString())

    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._session is None:
            raise RuntimeError("activate() the runner before infer()")
        names = [node.name for node in self._session.get_outputs()]
        try:
            values = self._session.run(names, feed)
        except Exception as err:
            first_line = one_line(err)
            raise InputsRejectedError(f"onnxruntime rejected the inputs: {first_line}") from err
        produced = dict(zip(names, values, strict=True))
        if not self.preserve_tensors:
            return produced
        self._last = produced
        return {name: produced[name] for name in self.output_names()}

    exposes_intermediates = True

    @classmethod
    def arithmetic_precision(cls, options: dict[str, Any]) -> str | None:
        """TensorRT's int8 or fp16 build: its layers may run in that precision, judged by its tolerance."""
        build = options.get("tensorrt")
        if build is None or "TensorrtExecutionProvider" not in resolve_providers(options.get("providers", ())):
            return None
        return "int8" if build.int8 else "fp16" if build.fp16 else None

    @classmethod
    def arithmetic_remedy(cls, options: dict[str, Any]) -> str | None:
        build = options.get("tensorrt")
        if build is None:
            return None
        flag = "--trt-int8" if build.int8 else "--trt-fp16"
        return f"without {flag} TensorRT builds the file's own precision"

    @classmethod
    def keeps_intermediates(cls, options: dict[str, Any]) -> bool:
        """The CPU provider only: TensorRT builds its engine around the graph's outputs and the CUDA provider runs
        fused kernels (onnxruntime's fusions stop at a value that is an output), so a value made an output there is
        not the one the file computes; their layers are read from files cut at a layer."""
        providers = resolve_providers(options.get("providers", DEFAULT_PROVIDERS))
        return all(provider == "CPUExecutionProvider" for provider in providers)

    def tapped(self, names: list[str] | None = None) -> dict[str, np.ndarray]:
        if not self.preserve_tensors or not self._last:
            raise RuntimeError("tapped() needs a runner made with preserve_tensors=True, after infer()")
        if names is None:
            return {k: v for k, v in self._last.items() if v.dtype.kind == "f" and v.ndim >= 2}
        return {name: self._last[name] for name in names if name in self._last}

    def input_specs(self) -> list[TensorSpec]:
        specs = []
        for node in self._session.get_inputs():
            shape = tuple(d if isinstance(d, int) else None for d in node.shape)
            specs.append(TensorSpec(node.name, _ORT_TYPES.get(node.type, node.type), shape))
        return specs

    def output_names(self) -> list[str]:
        if self.preserve_tensors:
            return list(self._outputs)
        return [node.name for node in self._session.get_outputs()]

    def describe(self) -> str:
        short = {v: k for k, v in PROVIDER_ALIASES.items()}
        gpu = any(p != "CPUExecutionProvider" for p in self.providers)
        trt = self.tensorrt.describe() if "TensorrtExecutionProvider" in self.providers else ""
        tf32 = " tf32" if self.tf32 and gpu else ""
        return f"onnxruntime[{','.join(short[p] for p in self.providers)}]{tf32}{trt}"

    def deactivate(self) -> None:
        self._session = None
        self._last = {}
