"""The library API: every CLI command is one call here."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pe_export.constants import (
    CALIBRATION_SAMPLES,
    CHILD_CONVERSION_MIN_WEIGHT_BYTES,
    CHOICE_SEED,
    HOLDOUT_EVERY,
    VERIFY_BATCH,
    VERIFY_SEED,
    VERIFY_SEQ_LEN,
)
from pe_export.converters.options import ExportOptions
from pe_export.converters.search.keep_float import ChoiceSamples
from pe_export.errors import (
    BadInputError,
    ConversionError,
    ExitCode,
    InputsRejectedError,
    ParityError,
    RuntimeUnavailableError,
)
from pe_export.fileio import check_output_path, publish, staged_file, staged_in_folder, write_staged
from pe_export.holdout import Cases, Parts, in_batches, samples, split_rows
from pe_export.inputs import generate_inputs, valid_positions
from pe_export.inspection.summary import ModelSummary
from pe_export.interrupts import raise_if_interrupted
from pe_export.parity.result import ParityReport
from pe_export.parity.tolerances import tolerance_for
from pe_export.precisions import Precision
from pe_export.provenance import (
    append_tflite_metadata,
    embed_onnx_metadata,
    embed_tflite_metadata,
    provenance_entries,
)
from pe_export.runners import NO_RUNTIME_FIX, create_runner, first_installed_runner
from pe_export.specs import BATCH_AXIS, SEQUENCE_AXIS, TensorSpec, feed_shape

if TYPE_CHECKING:
    from pe_export.lengths import SequenceLimit
    from pe_export.parity.result import OutputMetrics
    from pe_export.savedmodel import FrozenSignature, LoadedSavedModel
    from pe_export.sources import ModelSource
    from pe_export.tables.pipeline import PreparedGraph, TableResult


@dataclass
class ExportReport:
    file_format: str  # "tflite" or "onnx"
    source: Path
    output: Path
    signature: str
    input_specs: list[TensorSpec]
    options: ExportOptions
    summary: ModelSummary
    parity: ParityReport | None = None
    unverified_reason: str | None = None
    converter_log: str = ""
    tables: list[TableResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the exporter changed to make the file run
    written: bool = True  # False: the file failed verification and nothing was put at ``output``
    kept_failed: Path | None = None  # --keep-failed: where the failing file was kept instead
    # --allow-lossy: the file against the model with its compressed tables (lossy_reference.py), where the
    # parity against the model as it is failed: the loss accepted is the tables' alone
    against_lossy_tables: list[OutputMetrics] | None = None
    layer_map: str | None = None  # what the stamped layer map covers, or why there is none (pe_export/parity/layers)
    # the accuracy-driven searches that chose what stays float, each with its measured ranking (search/keep_float.py)
    searches: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The report as --json writes it: what was asked, what was written, what was decided and why, and
        the parity report (``ParityReport.to_dict``)."""
        from dataclasses import asdict

        return {
            "format": self.file_format,
            "source": str(self.source),
            "output": str(self.output),
            "written": self.written,
            "kept_failed": None if self.kept_failed is None else str(self.kept_failed),
            "exit_code": int(self.exit_code),
            "signature": self.signature,
            "inputs": [spec.describe() for spec in self.input_specs],
            "quantize": self.options.quantize,
            "precision": self.options.precision,
            "tolerance": asdict(self.options.tolerance),
            "file_bytes": self.summary.file_bytes,
            "notes": list(self.notes),
            "tables": [
                {
                    "name": result.table.name,
                    "method": result.method,
                    "exact": result.exact,
                    "bytes_before": result.bytes_before,
                    "bytes_after": result.bytes_after,
                    "max_error": result.max_error,
                }
                for result in self.tables
            ],
            "searches": self.searches,
            "layer_map": self.layer_map,
            "parity": None if self.parity is None else self.parity.to_dict(),
            "unverified_reason": self.unverified_reason,
        }

    @property
    def lossy_tables(self) -> list[TableResult]:
        return [t for t in self.tables if not t.exact]

    @property
    def loss_is_the_tables(self) -> bool:
        """--allow-lossy with lossy tables, and the file meets its tolerance against the model computed with
        them: what parity misses is the tables' loss, which the user accepted."""
        checked = self.against_lossy_tables or []
        accepted = bool(self.lossy_tables and self.options.tables.allow_lossy and checked)
        return accepted and all(output.within_tolerance for output in checked)

    @property
    def exit_code(self) -> ExitCode:
        if self.parity is not None and not self.parity.passed:
            return ExitCode.OK if self.loss_is_the_tables else ExitCode.PARITY_FAILED
        if self.options.verify and self.parity is None:
            return ExitCode.RUNTIME_UNAVAILABLE
        return ExitCode.OK

    def raise_for_status(self) -> None:
        """Raise the error that the exit code stands for; return quietly when it is OK."""
        if self.exit_code == ExitCode.PARITY_FAILED:
            assert self.parity is not None
            lossy = ", ".join(f"{t.table.name} ({t.method}, table error {t.max_error:.3g})" for t in self.lossy_tables)
            if self.kept_failed is not None:
                what = f"{self.output} was not written; the failing file is kept as {self.kept_failed} (--keep-failed):"
            else:
                what = (
                    f"{self.output} was not written (--keep-failed keeps a failing file as "
                    f"{failed_output_path(self.output).name}):"
                )
            if lossy and self.options.tables.allow_lossy:
                worst = min(self.against_lossy_tables or [], key=lambda o: (o.within_tolerance, o.cosine), default=None)
                beyond = (
                    f"{worst.name!r} errs {worst.max_abs:.3g} (cosine {worst.cosine:.6f})" if worst is not None else "?"
                )
                raise ParityError(
                    f"{what} --allow-lossy accepts the tables' loss only ({lossy}), and against the model computed "
                    f"with those tables the file still fails the {self.options.precision} tolerance: {beyond}. The "
                    "rest is the file's own (its precision or the converter's): try another --quantize, or verify "
                    "without --compress to see it alone"
                )
            if lossy:
                raise ParityError(
                    f"{what} lossy table compression breaks parity ({lossy}): {self.parity.failure_message()}. "
                    "Use a larger --compress, --compress-method angle where the table is a sinusoid, or --allow-lossy"
                )
            raise ParityError(f"{what} {self.parity.failure_message()}")
        if self.exit_code == ExitCode.RUNTIME_UNAVAILABLE:
            raise RuntimeUnavailableError(
                f"{self.output} was written but not verified: {self.unverified_reason}; pass --no-verify to "
                "accept it unverified, or run `pe-export parity` where a suitable runtime is installed"
            )


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
        plain = file_format == "tflite" and converts_in_child(options, source.weight_bytes)
        check_before_work(
            file_format,
            source.saved_model,
            options.quantize,
            options.force,
            converter_layout=plain,
            weights=source.weight_bytes,
        )
        try:
            report = _judged_by_accuracy(export, source, output, options, quiet)
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


def failed_output_path(output: Path) -> Path:
    """Where --keep-failed keeps a file that failed verification: the name says so."""
    output = Path(output)
    return output.with_name(f"{output.stem}.FAILED{output.suffix}")


def _judged_by_accuracy(
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
    job = _prepare("tflite", source, Path(output), options)
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

    data, log, notes = _no_larger_than_plain(
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


def _layer_map_entries(job: _Job, data: Any, float_file: bytes | None = None) -> dict[str, str]:
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
        options.precision_spec("tflite"),
        allow_flex,
        lambda: source.digest,
        options.precision,
        # the float32 file beside the one its search edits (full int8's is the float32 file only, always)
        with_float=options.precision_spec("tflite").edits_converter_file and options.verify,
    )


def _export_onnx(source: ModelSource, output: Path, options: ExportOptions, *, quiet: bool = True) -> ExportReport:
    from pe_export.converters.onnx.convert import convert_onnx, is_inline, model_bytes
    from pe_export.inspection.onnx_file import import_onnx, summarize_onnx_model

    job = _prepare("onnx", source, Path(output), options)
    float_files: list[bytes] = []  # the float32 model before quantization (for the layer map)

    data, log, notes = _no_larger_than_plain(
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


def _no_larger_than_plain(job: _Job, convert: Any) -> tuple[bytes, str, list[str]]:
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


@dataclass
class _Job:
    file_format: str
    source: Path  # the SavedModel folder read (a temporary export of a .keras file or checkpoint)
    output: Path
    options: ExportOptions
    loaded: LoadedSavedModel
    signature: str
    provenance: dict[str, str]
    frozen: FrozenSignature  # the signature at the export's input specs
    prepared: PreparedGraph | None = None
    given: Path | None = None  # what the user passed, where a tokenizer.json is looked for
    layer_map: str | None = None  # the report's line on the stamped layer map
    searches: list[dict[str, Any]] = field(default_factory=list)  # the written conversion's (ExportReport)

    @property
    def specs(self) -> list[TensorSpec]:
        return self.frozen.specs

    @property
    def rewritten(self) -> PreparedGraph | None:
        """The table pipeline's graph where it rebuilds a table; else None, and the plain graph is converted
        (a graph that rewrites nothing would only cost bytes: --compress never makes a file larger)."""
        prepared = self.prepared
        changes = prepared is not None and (prepared.replacements or prepared.unfolded or prepared.arithmetic)
        return prepared if changes else None

    @cached_property
    def check_length(self) -> int:
        """Sequence length for verification and int8 calibration (see lengths.checked_length).

        Rows added by --max-len have no reference to meet; a fixed length keeps its own.
        """
        from pe_export.specs import any_dynamic_length
        from pe_export.tables.pipeline import checked_positions

        if not any_dynamic_length(self.specs):
            return VERIFY_SEQ_LEN  # a fixed length keeps its own
        return checked_positions(self.limit, self.prepared) or VERIFY_SEQ_LEN

    @cached_property
    def limit(self) -> SequenceLimit | None:
        """The longest sequence the reference takes, where a table read by position bounds it (pe_export/lengths.py)."""
        from pe_export.lengths import model_limit

        return model_limit(self.loaded, self.frozen)

    def check_feeds(self) -> Cases:
        """The inputs a file is judged on (verification): --text or --inputs when given, which then stand for
        the distribution that matters; else generated full-length and padded rows. Where the export chooses by
        accuracy (int8), only the part its choices never saw (``parts``)."""
        return self.parts.check

    def choice_samples(self) -> ChoiceSamples:
        """The samples the precision's choices are made on (the choice part), as its search takes them."""
        feeds, valid = self.parts.choice
        return ChoiceSamples(
            list(feeds.values()), self.options.tolerance, [valid[case] for case in feeds], self.sequence_outputs
        )

    @property
    def precision(self) -> Precision:
        return self.options.precision_spec(self.file_format)

    @property
    def decides(self) -> bool:
        """Whether the export chooses by accuracy on the inputs (int8: smoothing, ranges, weights kept float)."""
        return self.precision.decides

    @property
    def chooser(self) -> str:
        """What makes the choices, in the notes: int8, or float16's arithmetic (ONNX: which nodes stay float32)."""
        return self.precision.chooser

    @cached_property
    def parts(self) -> Parts:
        """The inputs int8's choices are made on and those that judge them (pe_export/holdout.py); without a
        choice to make, both are every input. A file of a fixed batch takes the given samples that many at a
        time."""
        parts = self._parts()
        if self.options.text is None and self.options.inputs is None:
            return parts
        batch = self.specs[0].shape[BATCH_AXIS] if self.specs and self.specs[0].shape else None
        return replace(parts, choice=in_batches(parts.choice, batch), check=in_batches(parts.check, batch))

    def _parts(self) -> Parts:
        if self.options.text is None and self.options.inputs is None:
            check = verification_feeds(self.specs, self.bounds, self.check_length, masks=self.masks)
            if not self.decides:
                return Parts(check, check)
            choice = verification_feeds(self.specs, self.bounds, self.check_length, seed=CHOICE_SEED, masks=self.masks)
            note = f"{self.chooser} chose on generated inputs of its own, apart from those it is judged on"
            return Parts(choice, check, note)
        given = self.user_case
        if not self.decides:
            return Parts(given, given)
        if self.options.holdout is not None:
            held = self.user_cases(self.options.holdout, "holdout")
            return Parts(
                given,
                held,
                f"{self.chooser} chose on the {samples(given)} samples given, judged on the {samples(held)} of "
                "--holdout",
            )
        split = split_rows(given, HOLDOUT_EVERY)
        if split is None:
            note = f"{self.chooser} chose on the one sample given and is judged on it (--holdout FILE: others)"
            return Parts(given, given, note)
        choice, check = split
        return Parts(
            choice,
            check,
            f"{self.chooser} chose on {samples(choice)} of the {samples(given)} samples and is judged on the other "
            f"{samples(check)}, held out (every {HOLDOUT_EVERY}th; --holdout FILE gives them)",
        )

    @cached_property
    def sequence_outputs(self) -> set[str]:
        """The outputs whose axis 1 is the sequence (the padding mask applies), from the SavedModel's signature."""
        from pe_export.savedmodel import signature_input_specs, signature_output_specs
        from pe_export.specs import sequence_outputs

        signature = self.loaded.signature(self.options.signature)
        return sequence_outputs(signature_input_specs(signature), signature_output_specs(signature))

    @cached_property
    def user_case(self) -> Cases:
        """--text or --inputs as one case of all their samples, checked against the model's tables."""
        return self.user_cases(self.options.text.text if self.options.text else Path(self.options.inputs or ""))

    def user_cases(self, path: Path, case: str | None = None) -> Cases:
        """The samples in ``path``, read as --text's sentences or --inputs' arrays (whichever was given), as one
        case (named after the option, or ``case``)."""
        if self.options.text is not None:
            from pe_export.text_inputs import TextInputs, text_feed

            option = "--text" if path == self.options.text.text else "--holdout"
            sentences = TextInputs(path, self.options.text.tokenizer, option, self.options.text.mask_inputs)
            feed, valid = text_feed(
                self.specs, self.bounds, sentences, self.given or self.source, self.check_length, masks=self.masks
            )
            return {case or "text": feed}, {case or "text": valid}
        from pe_export.golden import user_batches
        from pe_export.parity.bundle import read_npz

        arrays = read_npz(path)
        count = max((array.shape[0] for array in arrays.values() if array.ndim), default=1)
        feed, valid = next(user_batches(path, arrays, self.specs, count, self.bounds, self.masks))
        return {case or "inputs": feed}, {case or "inputs": valid}

    @cached_property
    def bounds(self) -> dict[str, int]:
        """Integer input bounds, for verification and calibration only: an unverified export skips the freeze."""
        from pe_export.savedmodel import input_bounds

        return input_bounds(self.frozen)

    @cached_property
    def masks(self) -> frozenset[str]:
        """The padding-mask inputs, from how the graph uses them (pe_export/input_roles.py)."""
        from pe_export.savedmodel import input_masks

        return input_masks(self.frozen, self.bounds)


def _prepare(file_format: str, source: ModelSource, output: Path, options: ExportOptions) -> _Job:
    from pe_export.savedmodel import (
        FrozenSignature,
        load_savedmodel,
        signature_input_specs,
    )

    saved_model = source.saved_model  # options and output path were checked once, in _export
    loaded = load_savedmodel(saved_model)
    signature = loaded.signature(options.signature)
    model_specs = signature_input_specs(signature)
    specs = options.export_specs(model_specs)
    signature_name = loaded.resolve_signature_name(options.signature)
    frozen = FrozenSignature(signature, specs, name=signature_name)
    if options.seq_len is not None:
        _check_length_fits_tables(loaded, signature, model_specs, frozen, options.seq_len)
    provenance = provenance_entries(source.digest, options.precision, signature_name)
    prepared = None
    from pe_export.lengths import model_limit
    from pe_export.tables.pipeline import folds_relative_gather, prepare_graph

    arithmetic = _has_position_arithmetic(frozen)
    limit = model_limit(loaded, frozen) if arithmetic else None
    if options.tables.rewrites or folds_relative_gather(frozen) or arithmetic:
        tables = replace(options.tables, lossy_atol=tolerance_for(options.precision).atol)
        prepared = prepare_graph(
            loaded, frozen, tables, arithmetic=arithmetic, arithmetic_limit=limit.tokens if limit else None
        )
    job = _Job(
        file_format,
        saved_model,
        output,
        options,
        loaded,
        signature_name,
        provenance,
        frozen,
        prepared,
        given=source.given,
    )
    if arithmetic:
        job.__dict__["limit"] = limit  # measured once (the cached property's value)
    if options.text is not None or options.inputs is not None:
        _ = job.user_case  # bad --text, tokenizer or --inputs is refused before any conversion
    return job


def _has_position_arithmetic(frozen: FrozenSignature) -> bool:
    """A dynamic-length graph whose position arithmetic is frozen before conversion (tables/arithmetic.py)."""
    from pe_export.specs import any_dynamic_length
    from pe_export.tables.arithmetic import has_position_arithmetic

    if not any_dynamic_length(frozen.specs):
        return False
    graph_def, inputs, _ = frozen.graph()
    return has_position_arithmetic(graph_def, inputs)


def _check_length_fits_tables(
    loaded: LoadedSavedModel, signature: Any, model_specs: list[TensorSpec], frozen: FrozenSignature, seq_len: int
) -> None:
    """--seq-len past the longest sequence a dynamic-length model takes (its position table's rows less the offset
    its positions start at): what to do instead, in one line."""
    from pe_export.lengths import model_limit
    from pe_export.savedmodel import FrozenSignature
    from pe_export.tables.pipeline import fixed_length

    native = FrozenSignature(signature, model_specs)
    try:
        _ = frozen.concrete
    except BadInputError:
        if fixed_length(native):
            raise  # a fixed-length model: the message already says so
    if fixed_length(native):
        return
    limit = model_limit(loaded, native)
    if limit is None or seq_len <= limit.tokens:
        _ = frozen.concrete  # the shapes' own refusal, if any
        return
    raise BadInputError(
        f"--seq-len {seq_len} is longer than the model takes: {limit.describe()}; pass --seq-len {limit.tokens} or "
        f"less, or --dynamic-seq --max-len {seq_len + limit.offset} for a file whose tables are extended"
    ) from None


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


def verification_feeds(
    specs: list[TensorSpec],
    bounds: dict[str, int],
    seq_len: int = VERIFY_SEQ_LEN,
    seed: int = VERIFY_SEED,
    masks: Collection[str] | None = None,
) -> Cases:
    """Two cases, full-length rows and rows padded at several lengths, with their valid positions.

    ``seq_len`` sizes a dynamic sequence axis; a fixed one keeps the model's length.
    """
    feeds, valid = {}, {}
    for case, padded in (("random", False), ("padded", True)):
        feeds[case] = generate_inputs(
            specs, bounds, batch=VERIFY_BATCH, seq_len=seq_len, seed=seed, padded=padded, masks=masks
        )
        batch, length = feed_shape(feeds[case]) or (VERIFY_BATCH, seq_len)  # a fixed shape keeps its own
        valid[case] = valid_positions(batch, length, padded=padded)
    return feeds, valid


def _finish(job: _Job, data: bytes, summary: ModelSummary, log: str, notes: list[str] | None = None) -> ExportReport:
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


def _verify_staged(job: _Job, report: ExportReport, staged: Path) -> None:
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


def verify_export(job: _Job, runner_name: str, path: Path) -> ParityReport:
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
