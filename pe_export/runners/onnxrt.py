"""onnxruntime runner with explicit execution providers (never a silent CPU fallback)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np

from pe_export.errors import BadInputError, RuntimeUnavailableError, missing_extra, one_line
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


def session_providers(providers: list[str], tf32: bool) -> list[str | tuple[str, dict[str, str]]]:
    """The providers argument of InferenceSession: names, with CUDA's TF32 switch set."""
    return [(p, {"use_tf32": "1" if tf32 else "0"}) if p == "CUDAExecutionProvider" else p for p in providers]


@register_runner("onnxruntime", (".onnx",))
class OnnxRuntimeRunner(Runner):
    backend_module = "onnxruntime"
    option_names: ClassVar[tuple[str, ...]] = ("providers", "tf32")

    def __init__(
        self,
        *args: Any,
        providers: tuple[str, ...] = DEFAULT_PROVIDERS,
        tf32: bool = False,
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
        if "TensorrtExecutionProvider" in self.providers and not self.tf32:
            # Read when TensorRT builds the engine; a value the user set wins. Parity runs this in
            # its own child process, so only --no-isolate leaves it set in the caller's process.
            os.environ.setdefault(TF32_ENV, "0")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if self.threads:
            options.intra_op_num_threads = self.threads
        model: str | bytes = str(self.model_path) if self.serialized is None else self.serialized
        if self.preserve_tensors:
            model = self._with_every_value_an_output()
        try:
            self._session = ort.InferenceSession(
                model,
                sess_options=options,
                providers=session_providers(self.providers, self.tf32),
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
            raise BadInputError(f"onnxruntime rejected the inputs: {first_line}") from err
        produced = dict(zip(names, values, strict=True))
        if not self.preserve_tensors:
            return produced
        self._last = produced
        return {name: produced[name] for name in self.output_names()}

    exposes_intermediates = True

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
        return f"onnxruntime[{','.join(short[p] for p in self.providers)}]" + (" tf32" if self.tf32 and gpu else "")

    def deactivate(self) -> None:
        self._session = None
        self._last = {}
