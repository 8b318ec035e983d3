"""What a parity check is asked (ParityOptions) and what it finds (ParityReport, OutputMetrics): plain data.

Nothing here imports numpy or a runtime: the process that supervises a check in a child
(pe_export/parity/supervisor.py) builds the options, rebuilds the report from the child's JSON and
formats it with these types alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pe_export.constants import DEFAULT_TIMEOUT_S, MAX_THREADS
from pe_export.errors import BadInputError, ExitCode, ParityError, check_range
from pe_export.parity.tolerances import Tolerance
from pe_export.runtime_options import (
    DEFAULT_GPU_PRECISION,
    DEFAULT_PROVIDERS,
    check_gpu_precision,
    check_tensorrt_modes,
    resolve_providers,
)


@dataclass(frozen=True)
class OutputMetrics:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    mean_abs: float
    max_rel: float
    cosine: float
    nan_count: int
    inf_count: int
    worst_index: tuple[int, ...]
    within_tolerance: bool
    compared: int = 0  # elements compared (padding excluded)
    violations: int = 0  # elements over atol + rtol·|expected|
    argmax_agreement: float | None = None
    position_max_abs: tuple[float, ...] | None = None  # per sequence position, padding excluded
    task_accuracy: float | None = None  # arg-max against the bundle's labels (where it has them)
    reference_accuracy: float | None = None  # the float32 reference's own, on the same labels
    # Task level for hidden states [batch, seq, d] with real padding: the worst row's cosine of the
    # mean over its valid positions (a sentence embedding, as mean-pooling encoders use them).
    pooled_cosine: float | None = None
    case: str | None = None  # the inputs judged apart (an export's "random" and "padded"); None: all of them

    @property
    def label(self) -> str:
        return f"{self.name} ({self.case} inputs)" if self.case else self.name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutputMetrics:
        profile = data.get("position_max_abs")
        return cls(
            **{
                **data,
                "shape": tuple(data["shape"]),
                "worst_index": tuple(data["worst_index"]),
                "position_max_abs": None if profile is None else tuple(profile),
            }
        )

    def cosines(self) -> str:
        """The cosines the tolerance judges, for a failure message."""
        pooled = "" if self.pooled_cosine is None else f", worst row's mean-pooled cosine {self.pooled_cosine:.6f}"
        return f"cosine {self.cosine:.6f}{pooled}"


@dataclass(frozen=True)
class LayerMetrics:
    """One layer of the reference against the file's tensor that carries it (pe_export/parity/layers/compare.py)."""

    name: str
    tensor: str  # the file's tensor
    max_abs: float
    mean_abs: float
    cosine: float
    relative_error: float  # ‖a − e‖ / ‖e‖ over the compared elements
    growth: float | None  # relative_error over the largest of the layers before it (None for the first)
    atol: float
    rtol: float
    min_cosine: float
    ok: bool
    violations: int
    compared: int
    pooled_cosine: float | None = None
    position_max_abs: tuple[float, ...] | None = None  # per sequence position, padding excluded

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerMetrics:
        profile = data.get("position_max_abs")
        return cls(**{**data, "position_max_abs": None if profile is None else tuple(profile)})


@dataclass(frozen=True)
class LayerReport:
    """``parity --layers``: the mapped layers in graph order, and those of the bundle the file cannot show."""

    layers: list[LayerMetrics]
    unmapped: dict[str, str]  # layer → why the file has no tensor for it
    kernels: str  # how the intermediates were read (a runtime's note: "builtin kernels, XNNPACK off")

    @property
    def first_divergence(self) -> str | None:
        return next((layer.name for layer in self.layers if not layer.ok), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": [layer.to_dict() for layer in self.layers],
            "first_divergence": self.first_divergence,
            "unmapped_layers": self.unmapped,
            "kernels": self.kernels,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerReport:
        return cls(
            [LayerMetrics.from_dict(layer) for layer in data["layers"]], dict(data["unmapped_layers"]), data["kernels"]
        )


def bisection_steps(layers: int) -> int:
    """How many cut files `parity --layers` runs at most where the runtime keeps no intermediate (the last layer
    first, then halving: pe_export/parity/layers/check.py); the supervising process allows a heartbeat per batch of
    each."""
    return 1 + max(layers, 1).bit_length()


@dataclass(frozen=True)
class ParityOptions:
    runtime: str | None = None  # default: the first installed runtime for the file
    providers: tuple[str, ...] = DEFAULT_PROVIDERS
    precision: str | None = None  # default: stamped in the file, else fp32
    atol: float | None = None
    rtol: float | None = None
    output_atol: dict[str, float] = field(default_factory=dict)
    output_rtol: dict[str, float] = field(default_factory=dict)
    ignore_digest: bool = False
    isolate: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S
    threads: int | None = None
    tf32: bool = False  # allow TF32 math on CUDA/TensorRT (see runners.onnxrt)
    gpu_precision: str = DEFAULT_GPU_PRECISION  # litert-gpu's arithmetic (see runners.litert_gpu)
    cpu_fallback: bool = False  # litert-gpu: let the CPU run ops the GPU lacks
    trt_fp16: bool = False  # TensorRT may build float16 layers (judged by the fp16 tolerance)
    trt_int8: bool = False  # TensorRT may build int8 layers from the file's Q/DQ scales (the int8 tolerance)
    trt_cache: str | None = None  # folder of TensorRT engines and timing data, kept between sessions
    # A device target's tolerances (precision → atol/rtol): over the defaults and the bundle's, under the options'.
    target_tolerances: dict[str, dict[str, float]] = field(default_factory=dict)
    layers: bool = False  # also compare the bundle's layer activations with the file's tensors (golden --layers)
    bisect: bool = False  # with layers: judge files cut at a layer, run as the runtime runs them (layers/check.py)

    def validate(self) -> None:
        resolve_providers(self.providers)  # a typo is an error even when the file is .tflite
        check_gpu_precision(self.gpu_precision)
        check_tensorrt_modes(self.providers, self.trt_fp16, self.trt_int8, self.trt_cache)
        if not self.timeout_s > 0:  # an open interval: any positive number of seconds
            raise BadInputError(f"--timeout {self.timeout_s:g} is out of range; expected seconds > 0")
        check_range("--threads", self.threads, 1, MAX_THREADS)
        if self.bisect and not self.layers:
            raise BadInputError(
                "--bisect finds the first layer over tolerance in files cut at a layer; it needs --layers"
            )


@dataclass
class ParityReport:
    """What a file computed against its float32 reference: a golden bundle on disk (`pe-export parity`), or
    the SavedModel itself on in-memory batches (an export's own check, ``bundle`` None)."""

    model: Path
    bundle: Path | None
    runtime: str
    precision: str
    digest: str  # "match", "absent" or "ignored"
    tolerances: dict[str, Tolerance]
    outputs: list[OutputMetrics]
    samples: int
    load_s: float
    first_result_s: float
    total_s: float
    arithmetic: str | None = None  # the runtime's own precision when coarser than the file's (a GPU's fp16)
    arithmetic_remedy: str | None = None  # what the runtime offers instead when that arithmetic fails
    positions: int | None = None  # sequence length compared (None: no sequence axis)
    layers: LayerReport | None = None  # with --layers

    @property
    def passed(self) -> bool:
        layers_ok = self.layers is None or self.layers.first_divergence is None
        return all(m.within_tolerance for m in self.outputs) and layers_ok

    @property
    def reference(self) -> str:
        return "TensorFlow float32" if self.bundle is None else str(self.bundle)

    @property
    def max_abs(self) -> float:
        return max((m.max_abs for m in self.outputs), default=0.0)

    @property
    def min_cosine(self) -> float:
        return min((m.cosine for m in self.outputs), default=1.0)

    def worst_failure(self) -> OutputMetrics | None:
        """The failing output with the largest error (None when it passed)."""
        return max((m for m in self.outputs if not m.within_tolerance), key=lambda m: m.max_abs, default=None)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK if self.passed else ExitCode.PARITY_FAILED

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": str(self.model),
            "bundle": None if self.bundle is None else str(self.bundle),
            "reference": self.reference,
            "runtime": self.runtime,
            "precision": self.precision,
            "arithmetic": self.arithmetic,
            "arithmetic_remedy": self.arithmetic_remedy,
            "digest": self.digest,
            "passed": self.passed,
            "samples": self.samples,
            "positions": self.positions,
            "timing_s": {"load": self.load_s, "first_result": self.first_result_s, "total": self.total_s},
            "tolerances": {name: vars(tol) for name, tol in self.tolerances.items()},
            "outputs": [m.to_dict() for m in self.outputs],
            **({} if self.layers is None else self.layers.to_dict()),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ParityReport:
        """The report as ``to_dict`` wrote it (the supervising process reads the child's this way)."""
        timing = data["timing_s"]
        return cls(
            model=Path(data["model"]),
            bundle=None if data["bundle"] is None else Path(data["bundle"]),
            runtime=data["runtime"],
            precision=data["precision"],
            digest=data["digest"],
            tolerances={name: Tolerance(**values) for name, values in data["tolerances"].items()},
            outputs=[OutputMetrics.from_dict(output) for output in data["outputs"]],
            samples=data["samples"],
            load_s=timing["load"],
            first_result_s=timing["first_result"],
            total_s=timing["total"],
            arithmetic=data.get("arithmetic"),
            arithmetic_remedy=data.get("arithmetic_remedy"),
            positions=data.get("positions"),
            layers=LayerReport.from_dict(data) if "layers" in data else None,
        )

    def failure_message(self) -> str:
        """One line: which output fails, by how much, against which tolerance, and where along the sequence."""
        failed = {m.name for m in self.outputs if not m.within_tolerance}  # an output in two cases is one output
        outputs = {m.name for m in self.outputs}
        worst = self.worst_failure()
        if worst is None and self.layers is not None and self.layers.first_divergence is not None:
            return self._layer_failure(self.layers)
        assert worst is not None, "failure_message() of a report that passed"
        tol = self.tolerances[worst.name]
        where = ""
        if worst.position_max_abs:
            profile = worst.position_max_abs
            peak = max(range(len(profile)), key=lambda i: -1.0 if profile[i] != profile[i] else profile[i])
            where = f", worst at sequence position {peak}"
        return (
            f"{self.model.name} fails parity on {self.runtime}: {len(failed)} of {len(outputs)} outputs over "
            f"tolerance; {worst.name!r}{f' ({worst.case} inputs)' if worst.case else ''} max abs {worst.max_abs:.3g} "
            f"(atol {tol.atol:g}, rtol {tol.rtol:g}, cosine ≥ {tol.min_cosine:g}), "
            f"{worst.cosines()}, {worst.violations} of {worst.compared} elements over{where}"
            + (
                f"; the runtime computed in {self.arithmetic}"
                + (f" ({self.arithmetic_remedy})" if self.arithmetic_remedy else "")
                if self.arithmetic in ("fp16", "int8")
                else ""
            )
            + (
                f"; first layer over tolerance: {self.layers.first_divergence!r}"
                if self.layers is not None and self.layers.first_divergence
                else ""
            )
        )

    def _layer_failure(self, report: LayerReport) -> str:
        first = next(layer for layer in report.layers if not layer.ok)
        over = sum(not layer.ok for layer in report.layers)
        return (
            f"{self.model.name} fails layer-wise parity on {self.runtime}: its outputs are within tolerance, "
            f"{over} of {len(report.layers)} layers are not; first {first.name!r}: max abs {first.max_abs:.3g} "
            f"(atol {first.atol:g}, rtol {first.rtol:g}, cosine ≥ {first.min_cosine:g}), cosine {first.cosine:.6f}"
        )


class ParityAssertionError(ParityError, AssertionError):
    """Raised by assert_parity; pytest shows it as an assertion failure with the report."""
