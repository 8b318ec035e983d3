"""A parity check in this process: bundle, runner and metrics (pe_export/parity/harness.py's check_parity
runs it here with ``isolate=False``, and in a child process through pe_export/parity/supervisor.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pe_export.errors import BadInputError
from pe_export.inspection.file_precision import file_precision
from pe_export.inspection.onnx_metadata import onnx_metadata
from pe_export.inspection.tflite_metadata import tflite_metadata
from pe_export.parity.bundle import Bundle, load_bundle
from pe_export.parity.compare import compare_batches
from pe_export.parity.result import ParityOptions, ParityReport
from pe_export.parity.tolerances import Tolerance, tolerance_for
from pe_export.provenance import PRECISION, SOURCE_DIGEST
from pe_export.runners import create_runner, resolve_runtime, runner_options_for, runners_for_file
from pe_export.runners.base import RUNNERS, Runner
from pe_export.specs import TensorSpec


def run_check(
    model: Path, bundle_path: Path, options: ParityOptions, progress: Callable[[], None] | None = None
) -> ParityReport:
    """The check in this process (``options`` already validated). ``progress`` is called once the runtime
    has loaded the model and after every batch."""
    model, started = Path(model), time.perf_counter()
    bundle = load_bundle(bundle_path)
    stamps = _stamps(model)
    digest = _check_digest(stamps.get(SOURCE_DIGEST), bundle, options.ignore_digest, model)
    runtime = resolve_runtime(model, options.runtime)
    extra = runner_options_for(runtime, options, lambda: [batch.inputs for batch in bundle.batches()])
    arithmetic = RUNNERS.get(runtime).arithmetic_precision(extra)
    remedy = RUNNERS.get(runtime).arithmetic_remedy(extra) if arithmetic is not None else None
    # Unstamped (another tool's file): the precision its own tensors state, never fp32 by default; read only
    # where no --precision says it.
    precision = options.precision or _judged_precision(stamps.get(PRECISION) or file_precision(model)[0], arithmetic)
    tolerances, overall = _tolerances(bundle, precision, options)
    layer_map = None
    if options.layers:  # refused before any work when the file or bundle cannot say it
        from pe_export.parity.layers.check import layers_checkable

        layer_map = layers_checkable(model, stamps, bundle, runtime, extra, options.bisect)
    runner = create_runner(runtime, model, **extra)
    first_result_s = 0.0

    def batch_done() -> None:
        nonlocal first_result_s
        first_result_s = first_result_s or time.perf_counter() - started
        if progress:
            progress()

    try:
        runner.activate()
        load_s = time.perf_counter() - started
        if progress:
            progress()
        _check_interface(runner, bundle, model)
        outputs = compare_batches(
            runner,
            bundle.batches(),
            tolerances,
            model_name=model.name,
            progress=batch_done,
            sequence_outputs=bundle.sequence_outputs,
        )
    finally:
        runner.deactivate()
    layers = None
    if layer_map is not None:
        from pe_export.parity.layers.check import check_layers

        layers = check_layers(model, bundle, runtime, extra, overall, layer_map, progress, options.bisect)
    return ParityReport(
        model=model,
        bundle=bundle.path,
        runtime=runner.describe(),
        precision=precision,
        digest=digest,
        tolerances=tolerances,
        outputs=outputs,
        samples=bundle.samples,
        load_s=load_s,
        first_result_s=first_result_s,
        total_s=time.perf_counter() - started,
        arithmetic=arithmetic,
        arithmetic_remedy=remedy,
        positions=bundle.seq_len,
        layers=layers,
    )


def _stamps(model: Path) -> dict[str, str]:
    """The metadata pe-export stamped in the file, and nothing else: ONNX without the onnx package (its import
    and a parsed copy of the weights would double the checking process), TFLite from the mapped flatbuffer."""
    if not model.is_file():
        raise BadInputError(f"{model} is not a file; expected a .tflite or .onnx model")
    if not runners_for_file(model):
        raise BadInputError(f"{model} is neither .tflite nor .onnx; parity checks exported files")
    if model.suffix.lower() == ".onnx":
        return onnx_metadata(model)
    return tflite_metadata(model)


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


def _tolerances(bundle: Bundle, precision: str, options: ParityOptions) -> tuple[dict[str, Tolerance], Tolerance]:
    """(per output, the overall one: what layers are judged by)."""
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
    per_output = {n: overall.override(options.output_atol.get(n), options.output_rtol.get(n)) for n in names}
    return per_output, overall


# Coarsest last: a file is judged by its own precision or the runtime's arithmetic, whichever is coarser.
_PRECISION_ORDER = ("fp32", "fp16", "int8")


def _judged_precision(file_precision: str, arithmetic: str | None) -> str:
    if arithmetic is None or file_precision not in _PRECISION_ORDER:
        return file_precision
    return max(file_precision, arithmetic, key=_PRECISION_ORDER.index)


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
