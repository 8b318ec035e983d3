"""Golden bundles: representative inputs, float32 reference outputs and a manifest (numpy only).

Layout of a bundle directory::

    manifest.json           what the bundle holds (validated on load, see validate_manifest)
    batches/00000.npz ...   one batch each: "input/<name>", "output/<name>", "valid" arrays

Arrays are read with ``allow_pickle=False``; one batch is in memory at a time.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pe_export.errors import BadInputError
from pe_export.specs import TensorSpec

MANIFEST = "manifest.json"
BUNDLE_FORMAT = "pe-export-golden"
BUNDLE_VERSION = 1
INPUT_PREFIX, OUTPUT_PREFIX, LABEL_PREFIX, VALID_KEY = "input/", "output/", "label/", "valid"
IGNORED_LABEL = -1  # label value for positions that carry no task target


@dataclass(frozen=True)
class Batch:
    index: int
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    valid: np.ndarray  # [batch, seq] booleans: real tokens True, padding False
    labels: dict[str, np.ndarray]  # task labels per output (class ids; -1 = ignore), where the bundle has them


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
    def label_outputs(self) -> list[str]:
        return list(self.manifest.get("labels", []))

    @property
    def samples(self) -> int:
        return int(self.manifest["samples"])

    def batches(self) -> Iterator[Batch]:
        """Stream the batches, validating each against the manifest."""
        for index, entry in enumerate(self.manifest["batches"]):
            yield self._load(index, entry)

    def _load(self, index: int, entry: dict[str, Any]) -> Batch:
        path = self.path / entry["file"]
        if _leaves(self.path, path):
            raise BadInputError(f"bundle {self.path}: {entry['file']} is a link to a file outside the bundle, which is "
                                "refused; a bundle holds its own files (copy it with cp -rL)")  # fmt: skip
        if not path.is_file():
            raise BadInputError(f"bundle {self.path}: {entry['file']} is missing; the bundle is incomplete")
        if file_sha256(path) != entry["sha256"]:
            raise BadInputError(f"bundle {self.path}: {entry['file']} does not match its sha256 in the manifest")
        arrays = read_npz(path)
        inputs = {k[len(INPUT_PREFIX) :]: v for k, v in arrays.items() if k.startswith(INPUT_PREFIX)}
        outputs = {k[len(OUTPUT_PREFIX) :]: v for k, v in arrays.items() if k.startswith(OUTPUT_PREFIX)}
        if VALID_KEY not in arrays:
            raise BadInputError(f"bundle {self.path}: {entry['file']} has no 'valid' mask")
        valid = arrays[VALID_KEY].astype(bool)
        samples = int(entry["samples"])
        for kind, specs, found in (("input", self.inputs, inputs), ("output", self.outputs, outputs)):
            missing = sorted({s.name for s in specs} - set(found))
            if missing:
                raise BadInputError(f"bundle {self.path}: {entry['file']} lacks {kind}s {', '.join(missing)}")
            for spec in specs:
                _check_array(self.path / entry["file"], kind, spec, found[spec.name], samples)
        for name, array in outputs.items():
            if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
                raise BadInputError(
                    f"bundle {self.path}: reference output {name!r} in {entry['file']} holds NaN/Inf; "
                    "regenerate the bundle from a model that produces finite outputs"
                )
        if valid.ndim != 2 or valid.shape[0] != samples:
            raise BadInputError(f"bundle {self.path}: {entry['file']} 'valid' has shape {valid.shape}")
        labels = {}
        for name in self.label_outputs:
            label = arrays.get(f"{LABEL_PREFIX}{name}")
            if label is None or not np.issubdtype(label.dtype, np.integer) or label.shape != outputs[name].shape[:-1]:
                raise BadInputError(
                    f"bundle {self.path}: {entry['file']} labels for {name!r} are missing or not integer class ids "
                    f"shaped like the output without its class axis"
                )
            labels[name] = label
        return Batch(index, inputs, outputs, valid, labels)


def _leaves(root: Path, path: Path) -> bool:
    """True when ``path`` (or a folder on the way to it) is a link that resolves outside ``root``."""
    try:
        return not path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a link loop
        return True


def _spec(entry: dict[str, Any]) -> TensorSpec:
    return TensorSpec(entry["name"], entry["dtype"], tuple(entry["shape"]))


def _check_array(where: Path, kind: str, spec: TensorSpec, array: np.ndarray, samples: int) -> None:
    if array.dtype.name != spec.dtype:
        raise BadInputError(f"bundle {where}: {kind} {spec.name!r} is {array.dtype.name}, manifest says {spec.dtype}")
    expected = (samples, *spec.shape[1:])
    if tuple(array.shape) != expected:
        raise BadInputError(
            f"bundle {where}: {kind} {spec.name!r} has shape {tuple(array.shape)}, manifest says {expected}"
        )


def read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except ValueError as err:  # object arrays need pickle, which is refused
        raise BadInputError(f"{path} holds object arrays (pickled data), which are refused; save plain arrays") from err
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise BadInputError(f"{path} is not a readable .npz file ({type(err).__name__})") from err


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


def validate_manifest(manifest: Any, where: Path) -> dict[str, Any]:
    """Check every field's presence and type; one line naming the first problem."""

    def fail(message: str) -> BadInputError:
        return BadInputError(f"{where}: {message}; regenerate the bundle with `pe-export golden`")

    if not isinstance(manifest, dict):
        raise fail("the manifest is not a JSON object")
    for field, kind in _TOP_FIELDS.items():
        if field not in manifest:
            raise fail(f"field {field!r} is missing")
        if not isinstance(manifest[field], kind) or isinstance(manifest[field], bool):
            raise fail(f"field {field!r} should be {getattr(kind, '__name__', kind)}")
    if manifest["format"] != BUNDLE_FORMAT or manifest["version"] != BUNDLE_VERSION:
        raise fail(f"format {manifest['format']!r} v{manifest['version']} is not {BUNDLE_FORMAT} v{BUNDLE_VERSION}")
    for key in ("digest", "signature"):
        if not isinstance(manifest["model"].get(key), str):
            raise fail(f"model.{key} should be a string")
    for field in ("inputs", "outputs"):
        if not manifest[field]:
            raise fail(f"field {field!r} is empty")
        for entry in manifest[field]:
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("name"), str)
                and isinstance(entry.get("dtype"), str)
                and isinstance(entry.get("shape"), list)
                and all(d is None or (isinstance(d, int) and d >= 0) for d in entry["shape"])
            ):
                raise fail(f"an entry of {field!r} is not {{name, dtype, shape}}")
            try:
                np.dtype(entry["dtype"])
            except TypeError as err:
                raise fail(f"dtype {entry['dtype']!r} of {entry['name']!r} is not a numpy dtype") from err
    labels = manifest.get("labels", [])
    output_names = {entry["name"] for entry in manifest["outputs"]}
    if not isinstance(labels, list) or not all(isinstance(n, str) and n in output_names for n in labels):
        raise fail("field 'labels' should list output names")
    for precision, tolerance in manifest["tolerances"].items():
        fields = ("atol", "rtol", "min_cosine")
        if not isinstance(tolerance, dict) or not all(
            isinstance(tolerance.get(f), int | float) and not isinstance(tolerance.get(f), bool) for f in fields
        ):
            raise fail(f"tolerances.{precision} is not {{atol, rtol, min_cosine}} numbers")
        if not all(np.isfinite(tolerance[f]) and tolerance[f] >= 0 for f in fields):
            raise fail(f"tolerances.{precision} holds a negative or non-finite number")
    total = 0
    for entry in manifest["batches"]:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("file"), str)
            and isinstance(entry.get("samples"), int)
            and isinstance(entry.get("sha256"), str)
        ):
            raise fail("a batch entry is not {file, samples, sha256}")
        file = Path(entry["file"])
        if file.is_absolute() or ".." in file.parts:
            raise fail(f"batch file {entry['file']!r} points outside the bundle")
        total += entry["samples"]
    if total != manifest["samples"]:
        raise fail(f"batches hold {total} samples, the manifest says {manifest['samples']}")
    return manifest


def load_bundle(path: Path) -> Bundle:
    path = Path(path)
    if not path.is_dir():
        raise BadInputError(f"{path} is not a directory; expected a golden bundle made by `pe-export golden`")
    manifest_path = path / MANIFEST
    if _leaves(path, manifest_path):
        raise BadInputError(f"{manifest_path} is a link to a file outside the bundle, which is refused; a bundle "
                            "holds its own files (copy it with cp -rL)")  # fmt: skip
    if not manifest_path.is_file():
        raise BadInputError(f"{path} has no {MANIFEST}; expected a golden bundle made by `pe-export golden`")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadInputError(f"{manifest_path} is not valid JSON ({err})") from err
    return Bundle(path, validate_manifest(manifest, manifest_path))
