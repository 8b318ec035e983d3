"""`pe-export golden`: representative inputs and float32 reference outputs, as a bundle (TF side)."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pe_export import __version__
from pe_export.constants import GOLDEN_BATCH, GOLDEN_SAMPLES, GOLDEN_SEQ_LEN, MAX_BATCH, MAX_SAMPLES, MAX_SEQ_LEN
from pe_export.errors import BadInputError, OutputExistsError, check_range
from pe_export.inputs import generate_inputs, is_mask_input, valid_positions
from pe_export.parity.bundle import Batch, read_npz, reference_batches, write_bundle
from pe_export.sources import ModelSource
from pe_export.specs import SEQUENCE_AXIS, TensorSpec, feed_shape, fixed_length, sequence_outputs
from pe_export.text_inputs import TextInputs, text_feed


@dataclass(frozen=True)
class GoldenOptions:
    signature: str | None = None
    samples: int = GOLDEN_SAMPLES
    batch: int = GOLDEN_BATCH
    seq_len: int | None = None  # default: the model's fixed length, else its position table's rows, else 16
    seed: int = 0
    inputs: Path | None = None  # user inputs (.npz keyed by input name, samples on axis 0)
    labels: Path | None = None  # task labels (.npz keyed by output name, class ids, -1 = ignore); with inputs
    overwrite: bool = False
    text: TextInputs | None = None  # sentences tokenized with the model's tokenizer.json, as the inputs
    layers: str | None = None  # also store the reference's activations: "blocks", "all" or a regex (layers/select.py)

    def validate(self) -> None:
        if self.labels is not None and self.inputs is None:
            raise BadInputError("--labels needs --inputs: labels are only meaningful for inputs you chose")
        if self.text is not None and self.inputs is not None:
            raise BadInputError("--text and --inputs both give the inputs; pass one of them")
        check_range("--samples", self.samples, 1, MAX_SAMPLES)
        check_range("--batch", self.batch, 1, MAX_BATCH)
        check_range("--seq-len", self.seq_len, 1, MAX_SEQ_LEN)
        if self.layers is not None:
            from pe_export.parity.layers.select import check_selection

            check_selection(self.layers)


@dataclass(frozen=True)
class GoldenResult:
    path: Path
    samples: int
    batches: int
    bytes: int
    digest: str
    seq_len: int
    layers: int = 0  # layers whose activations it holds
    layer_bytes: int = 0


def make_golden(
    saved_model: Path, output: Path, options: GoldenOptions, *, progress: Callable[[int, int], None] | None = None
) -> GoldenResult:
    from pe_export.fileio import check_output_folder
    from pe_export.sources import model_source

    options.validate()
    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())) and not options.overwrite:
        raise OutputExistsError(f"{output} already exists and is not empty; pass --overwrite to replace it")
    check_output_folder(output.parent, flag="-o", what=str(output))
    with model_source(Path(saved_model)) as source:
        return _make_golden(source, output, options, progress)


def _make_golden(
    source: ModelSource, output: Path, options: GoldenOptions, progress: Callable[[int, int], None] | None
) -> GoldenResult:
    from pe_export.lengths import checked_length, model_limit
    from pe_export.runners.savedmodel import SavedModelRunner
    from pe_export.savedmodel import (
        FrozenSignature,
        input_bounds,
        input_masks,
        load_savedmodel,
        signature_input_specs,
        signature_output_specs,
    )

    saved_model = source.saved_model
    loaded = load_savedmodel(saved_model)
    signature = loaded.signature(options.signature)
    model_specs = signature_input_specs(signature)
    frozen = FrozenSignature(signature, model_specs)  # one freeze for the table length and the input bounds
    user_arrays = read_npz(Path(options.inputs)) if options.inputs else None
    limit = model_limit(loaded, frozen) if fixed_length(model_specs) is None else None
    if options.seq_len is not None and limit is not None and options.seq_len > limit.tokens:
        raise BadInputError(
            f"--seq-len {options.seq_len} is longer than the model takes: {limit.describe()}; pass --seq-len "
            f"{limit.tokens} or less: the SavedModel cannot run longer sequences (an export's --max-len extends the "
            "exported file's table, not the SavedModel's)"
        )
    checked = checked_length(loaded, frozen)
    seq_len = options.seq_len or fixed_length(model_specs) or _user_seq_len(user_arrays) or checked or GOLDEN_SEQ_LEN
    bounds = input_bounds(frozen)
    masks = input_masks(frozen, bounds)
    text = None
    if options.text is not None:  # every sentence a row, padded to the longest (or the model's fixed length)
        length = options.seq_len if fixed_length(model_specs) is None else None  # --seq-len pads (or cuts) to it
        text = text_feed(model_specs, bounds, options.text, source.given, checked, length, masks=masks)
        seq_len = text[1].shape[SEQUENCE_AXIS]
    specs = [spec.at_length(seq_len) for spec in model_specs]
    if text is not None:
        batches = _rows_in_batches(*text, options.batch)
    elif options.inputs and user_arrays is not None:
        batches = user_batches(options.inputs, user_arrays, specs, options.batch, bounds, masks)
    else:
        batches = _generated_batches(specs, bounds, options, seq_len, masks)
    output_specs = {spec.name: spec for spec in signature_output_specs(signature)}
    labels = _user_labels(options.labels, output_specs, user_arrays) if options.labels else {}
    expected = options.samples if not (options.inputs or text) else None
    tapped = _LayerStore(frozen, options.layers, seq_len) if options.layers else None
    with SavedModelRunner(saved_model, signature=options.signature, loaded=loaded) as reference:
        written = _labelled(_deterministic(reference_batches(reference, batches), frozen, reference, source), labels)
        total, count = write_bundle(
            output,
            written if tapped is None else tapped.attach(written),
            model={
                "path": str(source.given),
                "digest": source.digest,
                "signature": loaded.resolve_signature_name(options.signature),
                **({"max_tokens": limit.tokens, "position_rows": limit.rows} if limit is not None else {}),
            },
            inputs=specs,
            outputs=[output_specs[name].at_length(seq_len) for name in sorted(output_specs)],
            seq_len=seq_len,
            created_by=_versions(),
            labels=labels,
            progress=None if progress is None else lambda done: progress(done, expected or done),
            sequence_outputs=sequence_outputs(model_specs, output_specs.values()),
            layers=None if tapped is None else tapped.entries,
        )
    size = sum(p.stat().st_size for p in output.rglob("*") if p.is_file())
    layers = (len(tapped.entries()), tapped.bytes) if tapped else (0, 0)
    return GoldenResult(output, total, count, size, source.digest, seq_len, *layers)


class _LayerStore:
    """The reference's activations at its layer boundaries, added to each batch (pe_export/parity/layers), bounded."""

    def __init__(self, frozen: Any, selection: str, seq_len: int) -> None:
        from pe_export.parity.layers.tap import LayerTap

        self.tap = LayerTap(frozen, selection)
        if not self.tap.layers:
            raise BadInputError(
                f"--layers {selection!r} selects no layer of this model; --layers all lists every layer boundary "
                "the graph has (name scopes that hand on one activation)"
            )
        self.seq_len, self.selection = seq_len, selection
        self.bytes = 0
        self._specs: dict[str, Any] = {}

    def attach(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        from pe_export.constants import MAX_LAYER_BYTES

        for batch in batches:
            layers = self.tap.activations(batch.inputs)
            self._specs = self._specs or {name: value for name, value in layers.items()}
            layers = {name: layers[name] for name in self._specs}  # the first batch's layers, every batch
            self.bytes += sum(value.nbytes for value in layers.values())
            if self.bytes > MAX_LAYER_BYTES:
                raise BadInputError(
                    f"--layers {self.selection!r}: the activations of {len(layers)} layers pass "
                    f"{MAX_LAYER_BYTES / 2**30:.0f} GiB at batch {batch.index + 1}; pass --layers blocks, a narrower "
                    "regular expression, or fewer --samples"
                )
            yield replace(batch, layers=layers)

    def entries(self) -> list[dict[str, Any]]:
        """The manifest's layer entries: name, dtype, shape (batch axis open), the graph tensor, sequence axis."""
        tensors = {layer.name: layer.tensor for layer in self.tap.layers}
        entries = []
        for name, value in self._specs.items():
            axes = _sequence_axes(value.shape, self.seq_len)
            entries.append(
                {
                    "name": name,
                    "dtype": value.dtype.name,
                    "shape": [None, *value.shape[1:]],
                    "tensor": tensors[name],
                    "sequence": axes == [1],  # axis 1 runs along the checked sequence, for readers of before
                    "sequence_axes": axes,  # every axis the padding mask applies along
                }
            )
        return entries


def _sequence_axes(shape: tuple[int, ...], length: int | None) -> list[int]:
    """The axes of a layer's activation that run along the sequence: query and key of attention scores or
    probabilities [batch, heads, query, key] (the last two, whatever the heads), else axis 1 of [batch, seq, ...];
    none for a 2-D one (a pooled vector)."""
    if len(shape) == 4 and shape[2] == shape[3] == length:
        return [2, 3]
    return [1] if len(shape) >= 3 and shape[1] == length else []


def _deterministic(batches: Iterator[Batch], frozen: Any, reference: Any, source: ModelSource) -> Iterator[Batch]:
    """The batches, the first checked to come out the same when the reference runs it again (determinism.py)."""
    from pe_export.determinism import refuse_random_reference

    for index, batch in enumerate(batches):
        if index == 0:
            refuse_random_reference(frozen.concrete, reference.infer, batch.inputs, batch.outputs, str(source.given))
        yield batch


def _labelled(batches: Iterator[Batch], labels: dict[str, np.ndarray]) -> Iterator[Batch]:
    """Each batch with its rows of the task labels (the labels hold every sample, in order)."""
    done = 0
    for batch in batches:
        rows = batch.valid.shape[0]
        yield replace(batch, labels={name: array[done : done + rows] for name, array in labels.items()})
        done += rows


def _generated_batches(
    specs: list[TensorSpec], bounds: dict[str, int], options: GoldenOptions, seq_len: int, masks: frozenset[str]
) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    done = 0
    index = 0
    while done < options.samples:
        batch = min(options.batch, options.samples - done)
        padded = index % 2 == 1  # alternate full-length and padded batches
        feed = generate_inputs(
            specs, bounds, batch=batch, seq_len=seq_len, seed=options.seed + index, padded=padded, masks=masks
        )
        rows, length = feed_shape(feed) or (batch, 1)
        yield feed, valid_positions(rows, length, padded=padded)
        done += batch
        index += 1


def _user_labels(
    path: Path, outputs: dict[str, TensorSpec], inputs: dict[str, np.ndarray] | None
) -> dict[str, np.ndarray]:
    arrays = read_npz(Path(path))
    samples = next(iter(inputs.values())).shape[0] if inputs else 0
    for name, array in arrays.items():
        if name not in outputs:
            raise BadInputError(f"--labels {path}: {name!r} is not an output; outputs are: {', '.join(outputs)}")
        if not np.issubdtype(array.dtype, np.integer) or array.shape[:1] != (samples,):
            raise BadInputError(
                f"--labels {path}: {name!r} must be integer class ids with {samples} samples on axis 0, "
                f"got {array.dtype}{list(array.shape)}"
            )
    return {name: array.astype(np.int64) for name, array in arrays.items()}


def _rows_in_batches(
    feed: dict[str, np.ndarray], valid: np.ndarray, batch: int
) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    for start in range(0, valid.shape[0], batch):
        yield {name: array[start : start + batch] for name, array in feed.items()}, valid[start : start + batch]


def _user_seq_len(arrays: dict[str, np.ndarray] | None) -> int | None:
    lengths = {array.shape[SEQUENCE_AXIS] for array in (arrays or {}).values() if array.ndim > SEQUENCE_AXIS}
    return lengths.pop() if len(lengths) == 1 else None


def user_batches(
    path: Path,
    arrays: dict[str, np.ndarray],
    specs: list[TensorSpec],
    batch: int,
    bounds: dict[str, int],
    masks: frozenset[str] | None = None,
) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """--inputs as batches, checked first: the model's input names, dtypes, fixed axes, and ids inside the
    tables they index (``bounds``: input name → rows). A batch's valid positions are its padding mask's
    (``masks``: as the graph says; None: by name)."""
    names = {spec.name for spec in specs}
    if set(arrays) != names:
        raise BadInputError(
            f"--inputs {path} has arrays {', '.join(sorted(arrays)) or 'none'}; expected exactly: "
            f"{', '.join(sorted(names))}"
        )
    counts = {array.shape[0] if array.ndim else 0 for array in arrays.values()}
    if len(counts) != 1 or 0 in counts:
        raise BadInputError(f"--inputs {path}: every array needs the same number of samples on axis 0")
    feed = {}
    for spec in specs:
        array = arrays[spec.name]
        wanted = np.dtype(spec.dtype)
        if not np.can_cast(array.dtype, wanted, casting="same_kind") or not np.array_equal(array.astype(wanted), array):
            raise BadInputError(f"--inputs {path}: {spec.name!r} is {array.dtype}, the model takes {wanted}")
        for axis, size in enumerate(spec.shape[1:], start=1):
            if size is not None and (array.ndim <= axis or array.shape[axis] != size):
                raise BadInputError(
                    f"--inputs {path}: {spec.name!r} has shape {array.shape}; the model takes {spec.describe()}"
                )
        feed[spec.name] = array.astype(wanted)
        bound = bounds.get(spec.name)
        if bound is not None and array.size and not 0 <= int(array.min()) <= int(array.max()) < bound:
            raise BadInputError(
                f"--inputs {path}: {spec.name!r} holds ids {int(array.min())}…{int(array.max())}, but the table it "
                f"indexes has {bound} rows; expected ids from 0 to {bound - 1}"
            )
    total = counts.pop()
    given_masks = [feed[spec.name] for spec in specs if is_mask_input(spec, masks)]
    first = next(iter(feed.values()))
    for start in range(0, total, batch):
        part = {name: value[start : start + batch] for name, value in feed.items()}
        if given_masks:
            valid = given_masks[0][start : start + batch].astype(bool)
        else:
            valid = np.ones(first[start : start + batch].shape[:2], dtype=bool)
        yield part, valid


def _versions() -> dict[str, str]:
    from pe_export.native import import_tensorflow

    return {
        "pe_export": __version__,
        "tensorflow": str(import_tensorflow().__version__),
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
