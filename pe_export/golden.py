"""`pe-export golden`: representative inputs and float32 reference outputs, as a bundle (TF side)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pe_export import __version__
from pe_export.constants import GOLDEN_BATCH, GOLDEN_SAMPLES, GOLDEN_SEQ_LEN, MAX_BATCH, MAX_SEQ_LEN
from pe_export.errors import BadInputError, OutputExistsError
from pe_export.fileio import folder_mode
from pe_export.inputs import generate_inputs, is_mask_input, valid_positions
from pe_export.interrupts import raise_if_interrupted
from pe_export.parity.bundle import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    INPUT_PREFIX,
    LABEL_PREFIX,
    MANIFEST,
    OUTPUT_PREFIX,
    VALID_KEY,
    file_sha256,
    read_npz,
)
from pe_export.parity.tolerances import DEFAULT_TOLERANCES
from pe_export.sources import ModelSource
from pe_export.specs import TensorSpec, concrete_shape
from pe_export.text_inputs import TextInputs, text_feed

MAX_SAMPLES = 1_000_000


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

    def validate(self) -> None:
        if self.labels is not None and self.inputs is None:
            raise BadInputError("--labels needs --inputs: labels are only meaningful for inputs you chose")
        if self.text is not None and self.inputs is not None:
            raise BadInputError("--text and --inputs both give the inputs; pass one of them")
        for flag, value, maximum in (
            ("--samples", self.samples, MAX_SAMPLES),
            ("--batch", self.batch, MAX_BATCH),
            ("--seq-len", self.seq_len, MAX_SEQ_LEN),
        ):
            if value is not None and not 1 <= value <= maximum:
                raise BadInputError(f"{flag} {value} is out of range; expected an integer from 1 to {maximum}")


@dataclass(frozen=True)
class GoldenResult:
    path: Path
    samples: int
    batches: int
    bytes: int
    digest: str
    seq_len: int


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
    from pe_export.runners.savedmodel import SavedModelRunner
    from pe_export.savedmodel import (
        FrozenSignature,
        input_bounds,
        load_savedmodel,
        signature_input_specs,
        signature_output_specs,
    )
    from pe_export.tables.pipeline import checked_length, position_rows

    saved_model = source.saved_model
    loaded = load_savedmodel(saved_model)
    signature = loaded.signature(options.signature)
    model_specs = signature_input_specs(signature)
    frozen = FrozenSignature(signature, model_specs)  # one freeze for the table length and the input bounds
    user_arrays = read_npz(Path(options.inputs)) if options.inputs else None
    if options.seq_len is not None and _fixed_seq_len(model_specs) is None:
        rows = position_rows(loaded, frozen)
        if rows is not None and options.seq_len > rows:
            raise BadInputError(
                f"--seq-len {options.seq_len} is longer than the model's position table ({rows} rows); pass "
                f"--seq-len {rows} or less: the SavedModel cannot run longer sequences (an export's --max-len extends "
                "the exported file's table, not the SavedModel's)"
            )
    seq_len = (
        options.seq_len
        or _fixed_seq_len(model_specs)
        or _user_seq_len(user_arrays)
        or checked_length(loaded, frozen)
        or GOLDEN_SEQ_LEN
    )
    bounds = input_bounds(frozen)
    text = None
    if options.text is not None:  # every sentence a row, padded to the longest (or the model's fixed length)
        text = text_feed(model_specs, bounds, options.text, source.given, checked_length(loaded, frozen))
        seq_len = text[1].shape[1]
    specs = [_sized(spec, seq_len) for spec in model_specs]
    if text is not None:
        batches = _rows_in_batches(*text, options.batch)
    elif options.inputs and user_arrays is not None:
        batches = user_batches(options.inputs, user_arrays, specs, options.batch, bounds)
    else:
        batches = _generated_batches(specs, bounds, options, seq_len)
    output_specs = {spec.name: spec for spec in signature_output_specs(signature)}
    labels = _user_labels(options.labels, output_specs, user_arrays) if options.labels else {}
    reference = SavedModelRunner(saved_model, signature=options.signature, loaded=loaded)
    work = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent))
    try:
        os.chmod(work, folder_mode())  # mkdtemp makes 0700: a bundle is for other users (the device images) too
        (work / "batches").mkdir(mode=folder_mode())
        entries, total = [], 0
        with reference:
            for index, (feed, valid) in enumerate(batches):
                raise_if_interrupted()  # a Ctrl-C a finalizer swallowed still stops the bundle
                outputs = reference.infer(feed)
                name = f"batches/{index:05d}.npz"
                arrays = {f"{INPUT_PREFIX}{k}": v for k, v in feed.items()}
                arrays.update({f"{OUTPUT_PREFIX}{k}": v for k, v in outputs.items()})
                rows = valid.shape[0]
                arrays.update({f"{LABEL_PREFIX}{k}": v[total : total + rows] for k, v in labels.items()})
                arrays[VALID_KEY] = valid
                np.savez(work / name, **arrays)  # type: ignore[arg-type]  # numpy's stub: **kwds as allow_pickle
                samples = int(valid.shape[0])
                entries.append({"file": name, "samples": samples, "sha256": file_sha256(work / name)})
                total += samples
                if progress:
                    progress(total, options.samples if not (options.inputs or text) else total)
        digest = source.digest
        manifest = {
            "format": BUNDLE_FORMAT,
            "version": BUNDLE_VERSION,
            "created_by": _versions(),
            "model": {
                "path": str(source.given),
                "digest": digest,
                "signature": loaded.resolve_signature_name(options.signature),
            },
            "inputs": [_entry(spec) for spec in specs],
            "outputs": [_entry(_sized(output_specs[name], seq_len)) for name in sorted(output_specs)],
            "padding": "batches/*.npz 'valid' marks real tokens; padded positions are left out of parity",
            "batches": entries,
            "samples": total,
            "seq_len": seq_len,
            "tolerances": {name: vars(tol) for name, tol in DEFAULT_TOLERANCES.items()},
            "labels": sorted(labels),
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2))
        _publish(work, output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = sum(p.stat().st_size for p in output.rglob("*") if p.is_file())
    return GoldenResult(output, total, len(entries), size, digest, seq_len)


def _fixed_seq_len(specs: list[TensorSpec]) -> int | None:
    lengths = {spec.shape[1] for spec in specs if len(spec.shape) > 1 and spec.shape[1] is not None}
    return lengths.pop() if len(lengths) == 1 else None


def _sized(spec: TensorSpec, seq_len: int) -> TensorSpec:
    """Batch stays dynamic (None); a dynamic sequence axis takes the bundle's length."""
    spec = spec.with_axis(0, None)
    if len(spec.shape) > 1 and spec.shape[1] is None:
        spec = spec.with_axis(1, seq_len)
    return spec


def _entry(spec: TensorSpec) -> dict[str, object]:
    return {"name": spec.name, "dtype": spec.dtype, "shape": list(spec.shape)}


def _generated_batches(
    specs: list[TensorSpec], bounds: dict[str, int], options: GoldenOptions, seq_len: int
) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    done = 0
    index = 0
    while done < options.samples:
        batch = min(options.batch, options.samples - done)
        padded = index % 2 == 1  # alternate full-length and padded batches
        feed = generate_inputs(specs, bounds, batch=batch, seq_len=seq_len, seed=options.seed + index, padded=padded)
        shape = concrete_shape(specs[0], batch, seq_len)
        yield feed, valid_positions(shape[0], shape[1] if len(shape) > 1 else 1, padded=padded)
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
    lengths = {array.shape[1] for array in (arrays or {}).values() if array.ndim > 1}
    return lengths.pop() if len(lengths) == 1 else None


def user_batches(
    path: Path, arrays: dict[str, np.ndarray], specs: list[TensorSpec], batch: int, bounds: dict[str, int]
) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """--inputs as batches, checked first: the model's input names, dtypes, fixed axes, and ids inside the
    tables they index (``bounds``: input name → rows)."""
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
    masks = [feed[spec.name] for spec in specs if is_mask_input(spec)]
    first = next(iter(feed.values()))
    for start in range(0, total, batch):
        part = {name: value[start : start + batch] for name, value in feed.items()}
        if masks:
            valid = masks[0][start : start + batch].astype(bool)
        else:
            valid = np.ones(first[start : start + batch].shape[:2], dtype=bool)
        yield part, valid


def _publish(work: Path, output: Path) -> None:
    """Move the finished bundle into place; an old one is replaced only after the new one is whole."""
    if output.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".old", dir=output.parent))
        os.replace(output, trash / output.name)
        os.replace(work, output)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(work, output)


def _versions() -> dict[str, str]:
    from pe_export.native import import_tensorflow

    return {
        "pe_export": __version__,
        "tensorflow": str(import_tensorflow().__version__),
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
