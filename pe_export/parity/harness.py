"""`pe-export parity`: check an exported file against a golden bundle (no TensorFlow needed)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pe_export.errors import BadInputError, ExitCode, ParityError, RuntimeUnavailableError
from pe_export.inspection import inspect_path
from pe_export.interrupts import raise_if_interrupted
from pe_export.parity.bundle import Bundle, load_bundle
from pe_export.parity.metrics import OutputAccumulator, OutputMetrics
from pe_export.parity.tolerances import Tolerance, tolerance_for
from pe_export.provenance import PRECISION, SOURCE_DIGEST
from pe_export.runners import create_runner, first_installed_runner, runner_options, runners_for_file
from pe_export.runners.base import RUNNERS, Runner
from pe_export.runners.isolated import DEFAULT_TIMEOUT_S, IsolatedRunner
from pe_export.runners.litert_gpu import DEFAULT_GPU_PRECISION, check_gpu_precision
from pe_export.runners.onnxrt import DEFAULT_PROVIDERS, resolve_providers
from pe_export.specs import TensorSpec


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
    # A device target's tolerances (precision → atol/rtol): over the defaults and the bundle's, under the options'.
    target_tolerances: dict[str, dict[str, float]] = field(default_factory=dict)

    def validate(self) -> None:
        resolve_providers(self.providers)  # a typo is an error even when the file is .tflite
        check_gpu_precision(self.gpu_precision)
        if not self.timeout_s > 0:
            raise BadInputError(f"--timeout {self.timeout_s:g} is out of range; expected seconds > 0")
        if self.threads is not None and not 1 <= self.threads <= 1024:
            raise BadInputError(f"--threads {self.threads} is out of range; expected 1 to 1024")


@dataclass
class ParityReport:
    model: Path
    bundle: Path
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

    @property
    def passed(self) -> bool:
        return all(m.within_tolerance for m in self.outputs)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK if self.passed else ExitCode.PARITY_FAILED

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": str(self.model),
            "bundle": str(self.bundle),
            "runtime": self.runtime,
            "precision": self.precision,
            "arithmetic": self.arithmetic,
            "digest": self.digest,
            "passed": self.passed,
            "samples": self.samples,
            "timing_s": {"load": self.load_s, "first_result": self.first_result_s, "total": self.total_s},
            "tolerances": {name: vars(tol) for name, tol in self.tolerances.items()},
            "outputs": [m.to_dict() for m in self.outputs],
        }

    def failure_message(self) -> str:
        failed = [m for m in self.outputs if not m.within_tolerance]
        worst = max(failed, key=lambda m: m.max_abs)
        tol = self.tolerances[worst.name]
        where = ""
        if worst.position_max_abs:
            profile = worst.position_max_abs
            peak = max(range(len(profile)), key=lambda i: -1.0 if profile[i] != profile[i] else profile[i])
            where = f", worst at sequence position {peak}"
        return (
            f"{self.model.name} fails parity on {self.runtime}: {len(failed)} of {len(self.outputs)} outputs over "
            f"tolerance; {worst.name!r} max abs {worst.max_abs:.3g} (atol {tol.atol:g}, rtol {tol.rtol:g}), "
            f"{worst.cosines()}, {worst.violations} of {worst.compared} elements over{where}"
            + (f"; the runtime computed in {self.arithmetic} (--gpu-precision fp32 checks the file itself)"
               if self.arithmetic == "fp16" else "")
        )  # fmt: skip


class ParityAssertionError(ParityError, AssertionError):
    """Raised by assert_parity; pytest shows it as an assertion failure with the report."""


def check_parity(model: Path, bundle_path: Path, options: ParityOptions | None = None) -> ParityReport:
    options = options or ParityOptions()
    options.validate()
    model, started = Path(model), time.perf_counter()
    bundle = load_bundle(bundle_path)
    summary = _summarize(model)
    digest = _check_digest(summary.metadata.get(SOURCE_DIGEST), bundle, options.ignore_digest, model)
    runtime = options.runtime or first_installed_runner(model)
    if runtime is None:
        raise RuntimeUnavailableError(
            f"no runtime for {model.suffix} files is installed; pip install 'pe-export[device]'"
        )
    extra = _runner_options(runtime, options)
    arithmetic = RUNNERS.get(runtime).arithmetic_precision(extra)
    precision = options.precision or _judged_precision(summary.metadata.get(PRECISION) or "fp32", arithmetic)
    tolerances = _tolerances(bundle, precision, options)
    runner = _runner(runtime, model, options, extra)
    accumulators = {spec.name: OutputAccumulator(spec.name, tolerances[spec.name]) for spec in bundle.outputs}
    first_result_s = 0.0
    try:
        runner.activate()
        load_s = time.perf_counter() - started
        _check_interface(runner, bundle, model)
        for batch in bundle.batches():
            raise_if_interrupted()
            produced = runner.infer(batch.inputs)
            for name, accumulator in accumulators.items():
                if produced[name].shape != batch.outputs[name].shape:
                    raise ParityError(
                        f"{model.name}: output {name!r} has shape {produced[name].shape}, the bundle's reference "
                        f"{batch.outputs[name].shape} (batch {batch.index})"
                    )
                accumulator.update(produced[name], batch.outputs[name], batch.valid, batch.labels.get(name))
            if not first_result_s:
                first_result_s = time.perf_counter() - started
    finally:
        runner.deactivate()
    return ParityReport(
        model=model,
        bundle=bundle.path,
        runtime=runner.describe(),
        precision=precision,
        digest=digest,
        tolerances=tolerances,
        outputs=[acc.result() for acc in accumulators.values()],
        samples=bundle.samples,
        load_s=load_s,
        first_result_s=first_result_s,
        total_s=time.perf_counter() - started,
        arithmetic=arithmetic,
    )


def assert_parity(model: Path | str, golden: Path | str, **options: Any) -> ParityReport:
    """For pytest and CI: raise ParityAssertionError (an AssertionError) with the report when it fails."""
    from pe_export.report import format_parity_report

    report = check_parity(Path(model), Path(golden), ParityOptions(**options))
    if not report.passed:
        raise ParityAssertionError(report.failure_message() + "\n" + "\n".join(format_parity_report(report)))
    return report


def _summarize(model: Path) -> Any:
    if not model.is_file():
        raise BadInputError(f"{model} is not a file; expected a .tflite or .onnx model")
    if not runners_for_file(model):
        raise BadInputError(f"{model} is neither .tflite nor .onnx; parity checks exported files")
    return inspect_path(model)


def _check_digest(stamped: str | None, bundle: Bundle, ignore: bool, model: Path) -> str:
    if ignore:
        return "ignored"
    if stamped is None:
        return "absent"
    if stamped != bundle.digest:
        raise BadInputError(
            f"{model.name} was exported from SavedModel {stamped[:12]}…, the bundle from {bundle.digest[:12]}…: "
            "wrong bundle for this model (pass --ignore-digest to compare anyway)"
        )
    return "match"


def _tolerances(bundle: Bundle, precision: str, options: ParityOptions) -> dict[str, Tolerance]:
    base = tolerance_for(precision)
    pinned = bundle.manifest["tolerances"].get(precision)
    if isinstance(pinned, dict):
        base = Tolerance(**{k: float(pinned[k]) for k in ("atol", "rtol", "min_cosine")})
    target = options.target_tolerances.get(precision, {})
    base = base.override(target.get("atol"), target.get("rtol"))
    names = [spec.name for spec in bundle.outputs]
    unknown = sorted((set(options.output_atol) | set(options.output_rtol)) - set(names))
    if unknown:
        raise BadInputError(
            f"tolerance given for unknown output(s) {', '.join(unknown)}; outputs are: {', '.join(names)}"
        )
    overall = base.override(options.atol, options.rtol)
    return {name: overall.override(options.output_atol.get(name), options.output_rtol.get(name)) for name in names}


# Coarsest last: a file is judged by its own precision or the runtime's arithmetic, whichever is coarser.
_PRECISION_ORDER = ("fp32", "fp16", "int8")


def _judged_precision(file_precision: str, arithmetic: str | None) -> str:
    if arithmetic is None or file_precision not in _PRECISION_ORDER:
        return file_precision
    return max(file_precision, arithmetic, key=_PRECISION_ORDER.index)


def _runner_options(runtime: str, options: ParityOptions) -> dict[str, Any]:
    return runner_options(
        runtime, threads=options.threads, providers=options.providers, tf32=options.tf32,
        gpu_precision=options.gpu_precision, cpu_fallback=options.cpu_fallback,
    )  # fmt: skip


def _runner(runtime: str, model: Path, options: ParityOptions, extra: dict[str, Any]) -> Runner:
    create_runner(runtime, model, **extra)  # validates the name, the file kind and the providers up front
    if options.isolate:
        return IsolatedRunner(runtime, model, timeout_s=options.timeout_s, **extra)
    return create_runner(runtime, model, **extra)


def _check_interface(runner: Runner, bundle: Bundle, model: Path) -> None:
    model_inputs = {spec.name: spec for spec in runner.input_specs()}
    bundle_inputs = {spec.name: spec for spec in bundle.inputs}
    if set(model_inputs) != set(bundle_inputs):
        raise BadInputError(
            f"{model.name} takes inputs {', '.join(sorted(model_inputs))}; the bundle has "
            f"{', '.join(sorted(bundle_inputs))}: wrong bundle for this model"
        )
    for name, spec in bundle_inputs.items():
        theirs = model_inputs[name]
        if theirs.dtype != spec.dtype:
            raise BadInputError(f"input {name!r}: the bundle holds {spec.dtype}, {model.name} takes {theirs.dtype}")
        if not _compatible(theirs, spec):
            raise BadInputError(
                f"input {name!r}: the bundle's shape {spec.describe()} does not fit {model.name}'s {theirs.describe()}"
            )
    missing = sorted({s.name for s in bundle.outputs} - set(runner.output_names()))
    if missing:
        raise BadInputError(
            f"{model.name} has no output(s) {', '.join(missing)} (it has: {', '.join(runner.output_names())})"
        )


def _compatible(model_spec: TensorSpec, bundle_spec: TensorSpec) -> bool:
    if len(model_spec.shape) != len(bundle_spec.shape):
        return False
    return all(m is None or b is None or m == b for m, b in zip(model_spec.shape, bundle_spec.shape, strict=True))
