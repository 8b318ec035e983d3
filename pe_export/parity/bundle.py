"""Golden bundles: representative inputs, float32 reference outputs and a manifest (numpy only).

Layout of a bundle directory::

    manifest.json           what the bundle holds (validated on load, see validate_manifest)
    batches/00000.npz ...   one batch each: "input/<name>", "output/<name>", "valid" arrays, and with
                            `golden --layers` the reference's activations "layer/<layer path>"

Written by ``write_bundle`` (from `pe-export golden`), read by ``load_bundle``; arrays are read with
``allow_pickle=False`` and one batch is in memory at a time. An export's own check uses the same batches
in memory (``reference_batches``), so both are compared by one loop (pe_export/parity/compare.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pe_export.errors import BadInputError, one_line
from pe_export.fileio import folder_mode
from pe_export.interrupts import raise_if_interrupted
from pe_export.parity.tolerances import DEFAULT_TOLERANCES
from pe_export.specs import TensorSpec

if TYPE_CHECKING:
    from pe_export.runners.base import Runner

MANIFEST = "manifest.json"
BUNDLE_FORMAT = "pe-export-golden"
BUNDLE_VERSION = 1
INPUT_PREFIX, OUTPUT_PREFIX, LABEL_PREFIX, VALID_KEY = "input/", "output/", "label/", "valid"
LAYER_PREFIX = "layer/"
IGNORED_LABEL = -1  # label value for positions that carry no task target


@dataclass(frozen=True)
class Batch:
    index: int
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]  # the float32 reference's
    valid: np.ndarray  # [batch, seq] booleans: real tokens True, padding False
    labels: dict[str, np.ndarray] = field(default_factory=dict)  # class ids per output (-1 = ignore), if any
    case: str | None = None  # a named case is judged on its own (an export's "random" and "padded" inputs)
    layers: dict[str, np.ndarray] = field(default_factory=dict)  # the reference's activations, by layer path

    @property
    def where(self) -> str:
        return f"{self.case} inputs" if self.case else f"batch {self.index}"


def reference_batches(
    reference: Runner, feeds: Iterable[tuple[dict[str, np.ndarray], np.ndarray]], cases: Iterable[str | None] = ()
) -> Iterator[Batch]:
    """Run the (active) reference on each (inputs, valid mask): the batches a bundle holds. ``cases`` names
    them, in order, where each is to be judged on its own."""
    names = iter(cases)
    for index, (inputs, valid) in enumerate(feeds):
        raise_if_interrupted()  # a Ctrl-C a finalizer swallowed still stops the work
        yield Batch(index, inputs, reference.infer(inputs), valid, case=next(names, None))


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: dict[str, Any]

    @property
    def digest(self) -> str:
        return str(self.manifest["model"]["digest"])

    @property
    def inputs(self) -> list[TensorSpec]:
        return [_spec(entry) for entry in self.manifest["inputs"]]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [_spec(entry) for entry in self.manifest["outputs"]]

    @property
    def sequence_outputs(self) -> set[str] | None:
        """The outputs the padding mask applies to, as the manifest records them; None in a bundle written
        before it did (then by shape)."""
        entries = self.manifest["outputs"]
        if not all(isinstance(entry.get("sequence"), bool) for entry in entries):
            return None
        return {entry["name"] for entry in entries if entry["sequence"]}

    @property
    def layers(self) -> list[TensorSpec]:
        """The layers whose activations the batches hold (``golden --layers``), in graph order; none before."""
        return [_spec(entry) for entry in self.manifest.get("layers", [])]

    @property
    def sequence_axes(self) -> dict[str, tuple[int, ...]]:
        """Each layer's axes that run along the sequence (attention scores: query and key); a bundle written before
        they were recorded gives axis 1 where its entry says ``sequence``."""
        axes = {}
        for entry in self.manifest.get("layers", []):
            recorded = entry.get("sequence_axes")
            if isinstance(recorded, list) and all(isinstance(a, int) and a >= 1 for a in recorded):
                found = tuple(recorded)
            else:
                found = (1,) if entry.get("sequence") is True else ()
            if found:
                axes[entry["name"]] = found
        return axes

    @property
    def label_outputs(self) -> list[str]:
        return list(self.manifest.get("labels", []))

    @property
    def samples(self) -> int:
        return int(self.manifest["samples"])

    @property
    def seq_len(self) -> int | None:
        length = self.manifest.get("seq_len")
        return length if isinstance(length, int) and not isinstance(length, bool) else None

    def batches(self) -> Iterator[Batch]:
        """Stream the batches, validating each against the manifest."""
        for index, entry in enumerate(self.manifest["batches"]):
            yield self._load(index, entry)

    def _load(self, index: int, entry: dict[str, Any]) -> Batch:
        samples = int(entry["samples"])
        arrays = self._read_checked(entry["file"], entry["sha256"], samples)
        inputs = {k[len(INPUT_PREFIX) :]: v for k, v in arrays.items() if k.startswith(INPUT_PREFIX)}
        outputs = {k[len(OUTPUT_PREFIX) :]: v for k, v in arrays.items() if k.startswith(OUTPUT_PREFIX)}
        layers = {k[len(LAYER_PREFIX) :]: v for k, v in arrays.items() if k.startswith(LAYER_PREFIX)}
        where = f"bundle {self.path}: {entry['file']}"
        if VALID_KEY not in arrays:
            raise BadInputError(f"{where} has no 'valid' mask")
        valid = arrays[VALID_KEY].astype(bool)
        for kind, specs, found in (
            ("input", self.inputs, inputs),
            ("output", self.outputs, outputs),
            ("layer", self.layers, layers),
        ):
            missing = sorted({s.name for s in specs} - set(found))
            if missing:  # each present one's dtype and shape were checked from its header (_declared_check)
                raise BadInputError(f"{where} lacks {kind}s {', '.join(missing)}")
        for name, array in outputs.items():
            if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
                raise BadInputError(
                    f"bundle {self.path}: reference output {name!r} in {entry['file']} holds NaN/Inf; "
                    "regenerate the bundle from a model that produces finite outputs"
                )
        if valid.ndim != 2 or valid.shape[0] != samples:
            raise BadInputError(f"{where} 'valid' has shape {valid.shape}")
        return Batch(index, inputs, outputs, valid, self._labels(arrays, outputs, where), layers=layers)

    def _read_checked(self, file: str, sha256: str, samples: int) -> dict[str, np.ndarray]:
        """A batch file's arrays, once it is known to be the bundle's own, present and unchanged."""
        path = self.path / file
        if _leaves(self.path, path):
            raise BadInputError(
                f"bundle {self.path}: {file} is a link to a file outside the bundle, which is "
                "refused; a bundle holds its own files (copy it with cp -rL)"
            )
        if not path.is_file():
            raise BadInputError(f"bundle {self.path}: {file} is missing; the bundle is incomplete")
        if file_sha256(path) != sha256:
            raise BadInputError(f"bundle {self.path}: {file} does not match its sha256 in the manifest")
        return read_npz(path, self._declared_check(file, samples))

    def _declared_check(self, file: str, samples: int) -> Declared:
        """What a batch file's arrays may declare, checked before any is read: inputs and outputs as the
        manifest's specs say for the batch's ``samples``; the mask and labels no larger per sample than they are."""
        specs = (
            {f"{INPUT_PREFIX}{s.name}": s for s in self.inputs}
            | {f"{OUTPUT_PREFIX}{s.name}": s for s in self.outputs}
            | {f"{LAYER_PREFIX}{s.name}": s for s in self.layers}
        )
        largest = max((int(np.prod([d or 1 for d in s.shape[1:]])) for s in specs.values()), default=1)

        def check(key: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
            spec = specs.get(key)
            wanted = (samples, *spec.shape[1:]) if spec is not None else None
            if spec is not None and (dtype.name != spec.dtype or shape != wanted):
                raise BadInputError(
                    f"bundle {self.path}: {file} array {key!r} declares {shape} {dtype.name}, the manifest says "
                    f"{wanted} {spec.dtype}; the bundle was edited: regenerate it with `pe-export golden`"
                )
            if spec is None and (not shape or shape[0] != samples or int(np.prod(shape[1:])) > largest):
                raise BadInputError(
                    f"bundle {self.path}: {file} array {key!r} declares {shape}, more than {samples} samples of "
                    f"the manifest's tensors hold; the bundle was edited: regenerate it with `pe-export golden`"
                )

        return check

    def _labels(
        self, arrays: dict[str, np.ndarray], outputs: dict[str, np.ndarray], where: str
    ) -> dict[str, np.ndarray]:
        labels = {}
        for name in self.label_outputs:
            label = arrays.get(f"{LABEL_PREFIX}{name}")
            if label is None or not np.issubdtype(label.dtype, np.integer) or label.shape != outputs[name].shape[:-1]:
                raise BadInputError(
                    f"{where} labels for {name!r} are missing or not integer class ids "
                    f"shaped like the output without its class axis"
                )
            labels[name] = label
        return labels


def _leaves(root: Path, path: Path) -> bool:
    """True when ``path`` (or a folder on the way to it) is a link that resolves outside ``root``."""
    try:
        return not path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a link loop
        return True


def _spec(entry: dict[str, Any]) -> TensorSpec:
    return TensorSpec(entry["name"], entry["dtype"], tuple(entry["shape"]))


# Deflate expands at most about 1,032 to 1: a compressed member claiming more than that of its stored size lies.
DEFLATE_MAX_RATIO = 1032
Declared = Callable[[str, np.dtype, tuple[int, ...]], None]


def read_npz(path: Path, declared: Declared | None = None) -> dict[str, np.ndarray]:
    """The arrays of an .npz file, each member's .npy header read before its data: what the header declares
    must be what the member holds (a header that claims 2^40 elements would have numpy allocate them), and
    ``declared`` (a bundle's check against its manifest) sees each array's name, dtype and shape first.
    Object arrays (pickled data) are refused."""
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                with archive.open(info) as member:
                    arrays[key] = _read_member(path, key, info, member, declared)
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as err:
        raise BadInputError(f"{path} is not a readable .npz file ({type(err).__name__}: {one_line(err)})") from err
    return arrays


def _read_member(path: Path, key: str, info: zipfile.ZipInfo, member: Any, declared: Declared | None) -> np.ndarray:
    version = np.lib.format.read_magic(member)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(member)
    if dtype.hasobject:
        raise BadInputError(f"{path} holds object arrays (pickled data: {key!r}), which are refused; save plain arrays")
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    held = info.file_size - member.tell()
    stored = info.compress_size if info.compress_type == zipfile.ZIP_STORED else DEFLATE_MAX_RATIO * info.compress_size
    if size != held or size > stored:
        raise BadInputError(
            f"{path}: array {key!r} declares {tuple(shape)} {dtype.name} ({size:,} B) but its member holds "
            f"{min(held, stored):,} B; the file is damaged or was edited: regenerate it"
        )
    if declared is not None:
        declared(key, dtype, tuple(shape))
    data = np.frombuffer(member.read(size), dtype=dtype)
    if data.nbytes != size:
        raise BadInputError(f"{path}: array {key!r} is cut short ({data.nbytes:,} of {size:,} B); regenerate it")
    return data.reshape(shape, order="F" if fortran else "C").copy()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- manifest validation -------------------------------------------------------------

_TOP_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "version": int,
    "created_by": dict,
    "model": dict,
    "inputs": list,
    "outputs": list,
    "batches": list,
    "samples": int,
    "tolerances": dict,
}


class _ManifestProblem(Exception):
    """What is wrong with a manifest; validate_manifest turns it into the one-line BadInputError."""


def validate_manifest(manifest: Any, where: Path) -> dict[str, Any]:
    """Check every field's presence and type; one line naming the first problem."""
    try:
        _check_top_fields(manifest)
        for key in ("inputs", "outputs"):
            _check_specs(manifest[key], key)
        if "layers" in manifest:
            if not isinstance(manifest["layers"], list):
                raise _ManifestProblem("field 'layers' should be a list")
            if manifest["layers"]:
                _check_specs(manifest["layers"], "layers")
        output_names = {entry["name"] for entry in manifest["outputs"]}
        labels = manifest.get("labels", [])
        if not isinstance(labels, list) or not all(isinstance(n, str) and n in output_names for n in labels):
            raise _ManifestProblem("field 'labels' should list output names")
        for precision, tolerance in manifest["tolerances"].items():
            _check_tolerance(precision, tolerance)
        _check_batches(manifest["batches"], manifest["samples"])
    except _ManifestProblem as problem:
        raise BadInputError(f"{where}: {problem}; regenerate the bundle with `pe-export golden`") from None
    return manifest


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_top_fields(manifest: Any) -> None:
    if not isinstance(manifest, dict):
        raise _ManifestProblem("the manifest is not a JSON object")
    for key, kind in _TOP_FIELDS.items():
        if key not in manifest:
            raise _ManifestProblem(f"field {key!r} is missing")
        if not isinstance(manifest[key], kind) or isinstance(manifest[key], bool):
            raise _ManifestProblem(f"field {key!r} should be {getattr(kind, '__name__', kind)}")
    if manifest["format"] != BUNDLE_FORMAT or manifest["version"] != BUNDLE_VERSION:
        raise _ManifestProblem(
            f"format {manifest['format']!r} v{manifest['version']} is not {BUNDLE_FORMAT} v{BUNDLE_VERSION}"
        )
    for key in ("digest", "signature"):
        if not isinstance(manifest["model"].get(key), str):
            raise _ManifestProblem(f"model.{key} should be a string")


def _check_specs(entries: list[Any], key: str) -> None:
    if not entries:
        raise _ManifestProblem(f"field {key!r} is empty")
    for entry in entries:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and isinstance(entry.get("dtype"), str)
            and isinstance(entry.get("shape"), list)
            and all(d is None or (_is_int(d) and d >= 0) for d in entry["shape"])
        ):
            raise _ManifestProblem(f"an entry of {key!r} is not {{name, dtype, shape}}")
        try:
            np.dtype(entry["dtype"])
        except TypeError:
            raise _ManifestProblem(f"dtype {entry['dtype']!r} of {entry['name']!r} is not a numpy dtype") from None


def _check_tolerance(precision: str, tolerance: Any) -> None:
    fields = ("atol", "rtol", "min_cosine")
    if not isinstance(tolerance, dict) or not all(
        isinstance(tolerance.get(f), int | float) and not isinstance(tolerance.get(f), bool) for f in fields
    ):
        raise _ManifestProblem(f"tolerances.{precision} is not {{atol, rtol, min_cosine}} numbers")
    if not all(np.isfinite(tolerance[f]) and tolerance[f] >= 0 for f in fields):
        raise _ManifestProblem(f"tolerances.{precision} holds a negative or non-finite number")


def _check_batches(entries: list[Any], samples: int) -> None:
    total = 0
    for entry in entries:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("file"), str)
            and isinstance(entry.get("samples"), int)
            and isinstance(entry.get("sha256"), str)
        ):
            raise _ManifestProblem("a batch entry is not {file, samples, sha256}")
        file = Path(entry["file"])
        if file.is_absolute() or ".." in file.parts:
            raise _ManifestProblem(f"batch file {entry['file']!r} points outside the bundle")
        total += entry["samples"]
    if total != samples:
        raise _ManifestProblem(f"batches hold {total} samples, the manifest says {samples}")


def write_bundle(
    output: Path,
    batches: Iterable[Batch],
    *,
    model: dict[str, Any],
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    seq_len: int,
    created_by: dict[str, str],
    labels: Iterable[str] = (),
    progress: Callable[[int], None] | None = None,
    sequence_outputs: set[str] | None = None,
    layers: Callable[[], list[dict[str, Any]]] | None = None,
) -> tuple[int, int]:
    """Write ``batches`` as a bundle at ``output`` (a folder) and return (samples, batches). The bundle is
    built in a temporary folder beside ``output`` and moved into place whole; an old one is replaced only
    then. ``model`` holds the source's path, digest and signature; ``progress`` gets the samples so far;
    ``sequence_outputs`` (from the signature) are the outputs whose axis 1 is the sequence, recorded per
    output as ``"sequence"``: the padding mask applies to them only. ``layers`` gives the manifest's layer entries
    (name, dtype, shape, tensor, sequence) once the batches are written (their activations are in each batch)."""
    work = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent))
    try:
        os.chmod(work, folder_mode())  # mkdtemp makes 0700: a bundle is for other users (the device images) too
        (work / "batches").mkdir(mode=folder_mode())
        entries, total = [], 0
        for index, batch in enumerate(batches):
            name = f"batches/{index:05d}.npz"
            arrays = {f"{INPUT_PREFIX}{k}": v for k, v in batch.inputs.items()}
            arrays.update({f"{OUTPUT_PREFIX}{k}": v for k, v in batch.outputs.items()})
            arrays.update({f"{LABEL_PREFIX}{k}": v for k, v in batch.labels.items()})
            arrays.update({f"{LAYER_PREFIX}{k}": v for k, v in batch.layers.items()})
            arrays[VALID_KEY] = batch.valid
            np.savez(work / name, **arrays)  # type: ignore[arg-type]  # numpy's stub: **kwds as allow_pickle
            samples = int(batch.valid.shape[0])
            entries.append({"file": name, "samples": samples, "sha256": file_sha256(work / name)})
            total += samples
            if progress:
                progress(total)
        manifest = {
            "format": BUNDLE_FORMAT,
            "version": BUNDLE_VERSION,
            "created_by": created_by,
            "model": model,
            "inputs": [_entry(spec) for spec in inputs],
            "outputs": [
                {**_entry(spec), **({} if sequence_outputs is None else {"sequence": spec.name in sequence_outputs})}
                for spec in outputs
            ],
            "padding": "batches/*.npz 'valid' marks real tokens; padded positions are left out of parity",
            "batches": entries,
            "samples": total,
            "seq_len": seq_len,
            "tolerances": {name: vars(tol) for name, tol in DEFAULT_TOLERANCES.items()},
            "labels": sorted(labels),
        }
        if layers is not None:
            manifest["layers"] = layers()
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2))
        _publish(work, output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return total, len(entries)


def _entry(spec: TensorSpec) -> dict[str, object]:
    return {"name": spec.name, "dtype": spec.dtype, "shape": list(spec.shape)}


def _publish(work: Path, output: Path) -> None:
    """Move the finished bundle into place; an old one is replaced only after the new one is whole."""
    if output.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".old", dir=output.parent))
        os.replace(output, trash / output.name)
        os.replace(work, output)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(work, output)


def load_bundle(path: Path) -> Bundle:
    path = Path(path)
    if not path.is_dir():
        raise BadInputError(f"{path} is not a directory; expected a golden bundle made by `pe-export golden`")
    manifest_path = path / MANIFEST
    if _leaves(path, manifest_path):
        raise BadInputError(
            f"{manifest_path} is a link to a file outside the bundle, which is refused; a bundle "
            "holds its own files (copy it with cp -rL)"
        )
    if not manifest_path.is_file():
        raise BadInputError(f"{path} has no {MANIFEST}; expected a golden bundle made by `pe-export golden`")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadInputError(f"{manifest_path} is not valid JSON ({err})") from err
    return Bundle(path, validate_manifest(manifest, manifest_path))
