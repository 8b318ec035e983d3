"""One export's job: the SavedModel loaded and frozen at the export's shapes, its position tables prepared, and
the inputs it is checked on, split where its precision chooses by accuracy (the part it chooses on, the part that
judges it)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pe_export.constants import (
    CHOICE_SEED,
    HOLDOUT_EVERY,
    VERIFY_BATCH,
    VERIFY_SEED,
    VERIFY_SEQ_LEN,
)
from pe_export.converters.options import ExportOptions
from pe_export.converters.search.keep_float import ChoiceSamples
from pe_export.errors import BadInputError
from pe_export.holdout import Cases, Parts, in_batches, samples, split_rows
from pe_export.inputs import generate_inputs, valid_positions
from pe_export.parity.tolerances import tolerance_for
from pe_export.precisions import Precision
from pe_export.provenance import provenance_entries
from pe_export.specs import BATCH_AXIS, TensorSpec, feed_shape

if TYPE_CHECKING:
    from pe_export.lengths import SequenceLimit
    from pe_export.savedmodel import FrozenSignature, LoadedSavedModel
    from pe_export.sources import ModelSource
    from pe_export.tables.pipeline import PreparedGraph


@dataclass
class ExportJob:
    file_format: str
    source: Path  # the SavedModel folder read (a temporary export of a .keras file or checkpoint)
    output: Path
    options: ExportOptions
    loaded: LoadedSavedModel
    signature: str
    provenance: dict[str, str]
    frozen: FrozenSignature  # the signature at the export's input specs
    prepared: PreparedGraph | None = None
    given_path: Path | None = None  # what the user passed, where a tokenizer.json is looked for
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
        from pe_export.lengths import checked_positions
        from pe_export.specs import any_dynamic_length

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
        supplied = self.user_case
        if not self.decides:
            return Parts(supplied, supplied)
        if self.options.holdout is not None:
            held = self.user_cases(self.options.holdout, "holdout")
            return Parts(
                supplied,
                held,
                f"{self.chooser} chose on the {samples(supplied)} samples given, judged on the {samples(held)} of "
                "--holdout",
            )
        split = split_rows(supplied, HOLDOUT_EVERY)
        if split is None:
            note = f"{self.chooser} chose on the one sample given and is judged on it (--holdout FILE: others)"
            return Parts(supplied, supplied, note)
        choice, check = split
        return Parts(
            choice,
            check,
            f"{self.chooser} chose on {samples(choice)} of the {samples(supplied)} samples and is judged on the other "
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
                self.specs, self.bounds, sentences, self.given_path or self.source, self.check_length, masks=self.masks
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


def prepare_job(file_format: str, source: ModelSource, output: Path, options: ExportOptions) -> ExportJob:
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
    job = ExportJob(
        file_format,
        saved_model,
        output,
        options,
        loaded,
        signature_name,
        provenance,
        frozen,
        prepared,
        given_path=source.given,
    )
    if arithmetic:
        job.limit = limit  # measured once: the cached property takes it as its value
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
