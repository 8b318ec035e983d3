"""The library API: every CLI command is one call here."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pe_export.constants import (
    CALIBRATION_SAMPLES,
    CHILD_CONVERSION_MIN_WEIGHT_BYTES,
    VERIFY_BATCH,
    VERIFY_SEED,
)
from pe_export.converters.options import ExportOptions
from pe_export.errors import (
    ConversionError,
    ExitCode,
    InputsRejectedError,
)
from pe_export.export_job import ExportJob, prepare_job
from pe_export.export_report import ExportReport, failed_output_path
from pe_export.fileio import check_output_path, publish, staged_file, staged_in_folder, write_staged
from pe_export.inputs import generate_inputs
from pe_export.inspection.summary import ModelSummary
from pe_export.interrupts import raise_if_interrupted
from pe_export.parity.result import ParityReport
from pe_export.provenance import (
    append_tflite_metadata,
    embed_onnx_metadata,
    embed_tflite_metadata,
)
from pe_export.runners import NO_RUNTIME_FIX, create_runner, first_installed_runner
from pe_export.specs import SEQUENCE_AXIS, feed_shape

if TYPE_CHECKING:
    from pe_export.sources import ModelSource
    from pe_export.tables.pipeline import TableResult


def export_tflite(
    saved_model: Path, output: Path | None, options: ExportOptions, *, quiet: bool = True
) -> ExportReport:
    """A SavedModel, .keras file or checkpoint folder → verified .tflite at ``output`` (None:
    ``default_output_path``)."""
    return _export("tflite", _export_tflite, saved_model, output, options, quiet)


def export_onnx(saved_model: Path, output: Path | None, options: ExportOptions, *, quiet: bool = True) -> ExportReport:
    """A SavedModel, .keras file or checkpoint folder → verified .onnx at ``output`` (None:
    ``default_output_path``)."""
    return _export("onnx", _export_onnx, saved_model, output, options, quiet)


def _export(
    file_format: str, export: Any, given: Path, output: Path | None, options: ExportOptions, quiet: bool
) -> ExportReport:
    from pe_export.memory import check_before_work
    from pe_export.sources import model_source

    output = default_output_path(given, file_format) if output is None else Path(output)
    options.validate(file_format)
    check_output_path(output, overwrite=options.overwrite, suffix=f".{file_format}")  # before a .keras is exported
    with model_source(Path(given)) as source:
        converter_layout = file_format == "tflite" and converts_in_child(options, source.weight_bytes)
        check_before_work(
            file_format,
            source.saved_model,
            options.quantize,
            options.force,
            converter_layout=converter_layout,
            weights=source.weight_bytes,
        )
        try:
            report = _lossy_tables_kept_where_they_fail(export, source, output, options, quiet)
        except InputsRejectedError as err:  # a file of the export's own, on inputs the SavedModel took
            raise ConversionError(
                f"a {file_format} file of this export fails in its runtime on inputs the SavedModel runs ({err}); "
                "nothing was written: a conversion fault, please report it with `pe-export inspect` of the SavedModel"
            ) from err
    report.source = Path(given)
    return report


def default_output_path(saved_model: Path, file_format: str) -> Path:
    """Where an export goes without -o: ``<model folder name>.<file_format>`` (``<name>.keras`` → ``<name>``) here."""
    from pe_export.sources import output_stem

    return Path(f"{output_stem(saved_model)}.{file_format}")


def _lossy_tables_kept_where_they_fail(
    export: Any, source: ModelSource, output: Path, options: ExportOptions, quiet: bool
) -> ExportReport:
    """--compress with auto never fails for want of an exact method: a lossy table it chose that breaks the
    file's tolerance end to end is kept instead, the file made again, and the measured trade-off reported."""
    report = export(source, output, options, quiet=quiet)
    chosen = report.lossy_tables if options.tables.method == "auto" else []
    if report.exit_code != ExitCode.PARITY_FAILED or not chosen or options.tables.allow_lossy:
        return report
    worst = report.parity.worst_failure() if report.parity is not None else None
    assert worst is not None
    keep = tuple(t.table.node for t in chosen)
    if report.kept_failed is not None:  # superseded by the file made again
        report.kept_failed.unlink(missing_ok=True)
    retry = replace(options, tables=replace(options.tables, keep=keep))  # the failed file was never written
    kept = export(source, output, retry, quiet=quiet)
    for table in chosen:
        kept.notes.append(
            f"{table.table.name}: {table.method} ({table.bytes_after:,} B, table error {table.max_error:.3g}) made the "
            f"file err {worst.max_abs:.3g} on {worst.name!r} (cosine {worst.cosine:.6f}), over the "
            f"{options.precision} tolerance: table kept; --compress-method {table.method} --allow-lossy takes it"
        )
    return kept


def _export_tflite(source: ModelSource, output: Path, options: ExportOptions, *, quiet: bool = True) -> ExportReport:
    from pe_export.converters.tflite.convert import convert_tflite
    from pe_export.inspection.tflite_file import summarize_tflite_bytes

    early = _convert_before_loading(source, options)
    job = prepare_job("tflite", source, Path(output), options)
    if early is not None and early.signature != job.signature:
        early = None  # its provenance names another signature than the one this export resolved

    float_files: list[bytes] = []  # the float32 file the conversion made on the way, if any (for the layer map)

    def calibration() -> Iterator[dict[str, np.ndarray]]:
        if options.text is not None or options.inputs is not None:  # real inputs: one sample at a time
            feeds, valid = job.parts.choice
            for case, feed in feeds.items():  # one case, or one per batch where --batch fixes it
                rows = valid[case]
                if job.specs[0].shape[0] is not None:  # a fixed batch: the case as the file takes it
                    yield dict(feed)
                    continue
                for row in range(rows.shape[0]):
                    length = int(rows[row].sum()) if job.specs[0].dynamic_length else rows.shape[SEQUENCE_AXIS]
                    yield {name: array[row : row + 1, :length] for name, array in feed.items()}
            return
        for seed in range(CALIBRATION_SAMPLES):
            yield generate_inputs(
                job.specs,
                job.bounds,
                masks=job.masks,
                batch=VERIFY_BATCH,
                seq_len=job.check_length,
                seed=VERIFY_SEED + 1 + seed,
                padded=bool(seed % 2),
            )

    data, log, notes = _rebuilt_unless_larger(
        job,
        lambda prepared: convert_tflite(
            job.loaded,
            job.frozen,
            options,
            calibration,
            quiet=quiet,
            prepared=prepared,
            samples=job.choice_samples() if options.verify else None,
            preconverted=(early.data, early.log, early.float_data) if early is not None and prepared is None else None,
            float_out=float_files,
            searches=job.searches,
        ),
    )
    layer_map = _layer_map_entries(job, data, float_files[0] if len(float_files) == 1 else None)  # one conversion
    if early is None or data is not early.data:  # the child's file has its metadata already
        data = embed_tflite_metadata(data, {**job.provenance, **layer_map}, signature_key=job.signature)
    elif layer_map:  # the child stamped the rest: the map is added without re-packing the file
        data = append_tflite_metadata(data, layer_map) or embed_tflite_metadata(data, layer_map)
    early = None  # its bytes are not held past the embedding
    summary = summarize_tflite_bytes(data, Path(output))
    return _finish(job, data, summary, log, notes)


def _layer_map_entries(job: ExportJob, data: Any, float_file: bytes | None = None) -> dict[str, str]:
    """The layer map's metadata entry, where the export verifies and a runtime here runs the file (what it
    covers, or why there is none, is kept on the job for the report)."""
    if not (job.options.layer_map and job.options.verify):
        return {}
    from pe_export.errors import PeExportError
    from pe_export.layer_map_export import layer_map_for
    from pe_export.parity.layers.mapping import LAYER_MAP

    try:
        layer_map, why = layer_map_for(job, data, job.file_format, float_file)
    except PeExportError as err:  # the file cannot run here (Flex ops, no runtime): verification says so too
        job.layer_map = f"none: {err}"
        return {}
    except Exception as err:  # an optional stamp never fails the export: left out, the reason in the report
        from pe_export.errors import one_line

        job.layer_map = f"none: the layer map could not be made ({type(err).__name__}: {one_line(err)})"
        return {}
    if layer_map is None:
        job.layer_map = why
        return {}
    mapped, total = len(layer_map.tensors), len(layer_map.tensors) + len(layer_map.unmapped) + len(layer_map.fused)
    job.layer_map = f"{mapped} of {total} layers carried by a tensor of the file (parity --layers reads it)"
    return {LAYER_MAP: layer_map.to_json()}


def converts_in_child(options: ExportOptions, weight_bytes: int) -> bool:
    """Whether the TFLite file is converted in a child before this process loads the model (pe_export/converters/
    tflite/child.py): where the export keeps the SavedModel's signature as it is, the file is one conversion, and
    the weights are large enough for the converter's memory to matter (``CHILD_CONVERSION_MIN_WEIGHT_BYTES``)."""
    tables, shapes = options.tables, (options.seq_len, options.batch)
    return weight_bytes >= CHILD_CONVERSION_MIN_WEIGHT_BYTES and not (
        tables.rewrites or shapes != (None, None) or options.dynamic_seq
    )


def _convert_before_loading(source: ModelSource, options: ExportOptions) -> Any:
    """The child's conversion where ``converts_in_child``, else None."""
    from pe_export.converters.tflite.child import convert_in_child

    if not converts_in_child(options, source.weight_bytes):
        return None
    allow_flex = not options.builtins_only
    return convert_in_child(
        source.saved_model,
        options.signature,
        options.quantize,
        allow_flex,
        lambda: source.digest,
        options.precision,
        # the float32 file beside the one its search edits (full int8's is the float32 file only, always)
        with_float=options.precision_spec("tflite").edits_converter_file and options.verify,
    )


def _export_onnx(source: ModelSource, output: Path, options: ExportOptions, *, quiet: bool = True) -> ExportReport:
    from pe_export.converters.onnx.convert import convert_onnx, is_inline, model_bytes
    from pe_export.inspection.onnx_file import import_onnx, summarize_onnx_model

    job = prepare_job("onnx", source, Path(output), options)
    float_files: list[bytes] = []  # the float32 model before quantization (for the layer map)

    data, log, notes = _rebuilt_unless_larger(
        job,
        lambda prepared: convert_onnx(
            job.frozen,
            options,
            quiet=quiet,
            prepared=prepared,
            # float16 measures its values and static int8 calibrates on the inputs, whether verified or not
            samples=job.choice_samples() if options.verify or job.precision.calibrates else None,
            float_out=float_files if options.layer_map and options.verify else None,
            searches=job.searches,
        ),
    )
    layer_map = _layer_map_entries(job, data, float_files[0] if len(float_files) == 1 else None)  # one conversion
    model = import_onnx().load_from_string(data) if isinstance(data, bytes) else data
    embed_onnx_metadata(model, {**job.provenance, **layer_map})
    if is_inline(model):
        data = model.SerializeToString()
        summary = summarize_onnx_model(model, Path(output), len(data))
    else:  # past 2 GiB: written with external data (pe_export/converters/onnx/convert.py)
        data, summary = model, summarize_onnx_model(model, Path(output), model_bytes(model))
    return _finish(job, data, summary, log, notes)


def _rebuilt_unless_larger(job: ExportJob, convert: Any) -> tuple[bytes, str, list[str]]:
    """Convert with the rebuilt tables; where auto chose the rewrite and the file came out no smaller than
    the plain export (small tables: the rebuild's ops outweigh the bytes saved), write the plain one."""
    data, log, notes = convert(job.rewritten)
    tables = job.options.tables
    if job.rewritten is None or not job.rewritten.replacements or tables.method != "auto" or tables.max_len is not None:
        return data, log, notes  # a method asked by name, or --max-len (rows the plain file lacks)
    searches, job.searches = job.searches, []  # each conversion's own
    # the plain file keeps the frozen position arithmetic (it is what makes the file run), not the rebuilt tables
    plain_graph = replace(job.rewritten, replacements={}) if job.rewritten.arithmetic else None
    plain, plain_log, plain_notes = convert(plain_graph)
    if _payload_bytes(plain) > _payload_bytes(data):
        job.searches = searches
        return data, log, notes
    assert job.prepared is not None
    job.prepared.results = [
        result if result.method == "frozen" else result.kept("the rebuild made the file larger")
        for result in job.prepared.results
    ]
    note = (
        f"--compress: with the tables rebuilt the file was {_payload_bytes(data):,} B, plain "
        f"{_payload_bytes(plain):,} B (the rebuild's ops outweigh the table bytes saved): the plain file is written"
    )
    return plain, plain_log, [*plain_notes, note]


def _payload_bytes(data: Any) -> int:
    """A converted file's size: its bytes, or a ModelProto past 2 GiB (written with external data)."""
    from pe_export.converters.onnx.convert import model_bytes

    return len(data) if isinstance(data, bytes) else model_bytes(data)


def find_position_tables(saved_model: Path, options: ExportOptions) -> list[TableResult]:
    """`--list-tables`: every position table the exporters would see, nothing converted or written."""
    from pe_export.lengths import model_limit
    from pe_export.savedmodel import FrozenSignature, load_savedmodel, signature_input_specs
    from pe_export.sources import model_source
    from pe_export.specs import any_dynamic_length
    from pe_export.tables.pipeline import prepare_graph

    options.tables.validate()
    with model_source(Path(saved_model)) as source:
        loaded = load_savedmodel(source.saved_model)
        signature = loaded.signature(options.signature)
        specs = options.export_specs(signature_input_specs(signature))
        frozen = FrozenSignature(signature, specs)
        arithmetic = any_dynamic_length(frozen.specs)  # the tables it computes at run time are listed too
        limit = model_limit(loaded, frozen) if arithmetic else None
        listing = replace(options.tables, list_only=True)
        tokens = limit.tokens if limit else None
        return prepare_graph(loaded, frozen, listing, arithmetic=arithmetic, arithmetic_limit=tokens).results


def _finish(
    job: ExportJob, data: bytes, summary: ModelSummary, log: str, notes: list[str] | None = None
) -> ExportReport:
    """Stage the file beside its output path, verify it there, and only then put it at the output path: a file
    that fails verification, or a run interrupted before the end, leaves nothing at the output."""
    report = ExportReport(
        job.file_format,
        job.source,
        job.output,
        job.signature,
        job.specs,
        job.options,
        summary,
        converter_log=log,
        tables=job.prepared.results if job.prepared else [],
        notes=notes or [],
        layer_map=job.layer_map,
        searches=job.searches,
    )
    inline = isinstance(data, bytes)
    with staged_file(job.output) if inline else staged_in_folder(job.output) as staged:
        if inline:
            write_staged(staged, data, job.output)
        else:
            _write_external(data, staged, job.output)
        if job.options.verify:
            _verify_staged(job, report, staged)
            if job.limit is not None and job.limit.offset:  # where the table's rows are not what it takes
                report.notes.append(f"the model takes {job.limit.describe()}: verified within it")
            if job.parts.note:  # what int8 chose on and what judged it (only where it chooses)
                report.notes.append(job.parts.note)
        raise_if_interrupted()  # never publish after a Ctrl-C, even one a finalizer swallowed
        if report.exit_code == ExitCode.PARITY_FAILED:
            report.written = False
            if job.options.keep_failed:
                report.kept_failed = failed_output_path(job.output)
                _publish(staged, report.kept_failed, inline, overwrite=True)
            return report
        _publish(staged, job.output, inline, overwrite=job.options.overwrite)
    return report


def external_data_name(output: Path) -> str:
    """The file beside an ONNX model past 2 GiB that holds its weights: ``<model>.onnx.data``."""
    return f"{Path(output).name}.data"


def _write_external(model: Any, staged: Path, output: Path) -> None:
    from pe_export.converters.onnx.convert import write_onnx

    write_onnx(model, staged, external_data_name(output))


def _publish(staged: Path, path: Path, inline: bool, *, overwrite: bool) -> None:
    """The staged file at ``path``; a model with external data brings its data file first (its name follows
    the model's, so the model is pointed at it anew where the name changed)."""
    if not inline:
        from pe_export.converters.onnx.convert import relocate_external_data

        staged_data = staged.parent / external_data_name(staged)
        publish(staged_data, path.parent / external_data_name(path), overwrite=overwrite)
        if path.name != staged.name:
            relocate_external_data(staged, external_data_name(path))
    publish(staged, path, overwrite=overwrite)


def _verify_staged(job: ExportJob, report: ExportReport, staged: Path) -> None:
    runnable = [v for v in report.summary.runs_on if v.runs and not v.runtime.endswith("+flex")]
    runner_name = first_installed_runner(staged)
    if not runnable:
        report.unverified_reason = f"no pip runtime runs it ({report.summary.runs_on[0].why})"
    elif runner_name is None:
        report.unverified_reason = f"no runtime for {job.output.suffix} files is installed ({NO_RUNTIME_FIX})"
    else:
        report.parity = verify_export(job, runner_name, staged)
        if not report.parity.passed and report.lossy_tables and job.options.tables.allow_lossy:
            from pe_export.lossy_reference import against_lossy_tables

            report.against_lossy_tables = against_lossy_tables(job, runner_name, staged)


def verify_export(job: ExportJob, runner_name: str, path: Path) -> ParityReport:
    """The staged file against the SavedModel on the check's inputs, each case judged on its own: the
    reference's outputs make an in-memory bundle, compared by the loop `pe-export parity` runs."""
    import time

    from pe_export.determinism import refuse_random_reference
    from pe_export.parity.bundle import reference_batches
    from pe_export.parity.compare import compare_batches
    from pe_export.runners.savedmodel import SavedModelRunner

    feeds, valid = job.check_feeds()
    reference = SavedModelRunner(job.source, signature=job.options.signature, loaded=job.loaded)
    with reference:
        batches = list(reference_batches(reference, ((feeds[case], valid[case]) for case in feeds), list(feeds)))
        first = batches[0]
        refuse_random_reference(job.frozen.concrete, reference.infer, first.inputs, first.outputs, str(job.source))
    tolerances = {name: job.options.tolerance for name in sorted(batches[0].outputs)}
    started, done = time.perf_counter(), []  # timed as `pe-export parity` times the file: load, results
    with create_runner(runner_name, path) as candidate:
        load_s = time.perf_counter() - started
        outputs = compare_batches(
            candidate,
            batches,
            tolerances,
            model_name=job.output.name,
            progress=lambda: done.append(time.perf_counter() - started),
            sequence_outputs=job.sequence_outputs,
        )
        runtime = candidate.describe()
    shape = feed_shape(batches[0].inputs)
    return ParityReport(
        model=job.output,
        bundle=None,
        runtime=runtime,
        precision=job.options.precision,
        digest="match",  # the file was made from this SavedModel
        tolerances=tolerances,
        outputs=outputs,
        samples=sum(batch.valid.shape[0] for batch in batches),
        load_s=load_s,
        first_result_s=done[0],
        total_s=done[-1],
        positions=shape[1] if shape else None,
    )
