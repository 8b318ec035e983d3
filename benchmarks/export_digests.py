"""The sha256 of one model's exports at every precision, recorded before a refactoring and checked after it.

A change that means to move code, not behaviour, must write the same files byte for byte from the same SavedModel
(issue 54). The SavedModel is built once (``--build``) and kept, since Keras' initialisation is not the point:

    python benchmarks/export_digests.py --build /tmp/digest_model
    python benchmarks/export_digests.py /tmp/digest_model --record /tmp/before.json      # at the old commit
    python benchmarks/export_digests.py /tmp/digest_model --check /tmp/before.json       # at the new one

Prints one row per export (format, precision, options, sha256 or the error's line) and, with ``--check``, which rows
differ; exits 1 when any does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# (format, --quantize, --compress): every precision of both formats, and one lossy-table export
EXPORTS = [
    *[("tflite", mode, None) for mode in ("none", "float16", "dynamic-int8", "int8")],
    *[("onnx", mode, None) for mode in ("none", "float16", "weight-float16", "dynamic-int8", "int8", "weight-int8")],
    ("tflite", "none", 4),
    ("onnx", "none", 4),
]


def build(directory: Path) -> None:
    import keras

    from tests.fixtures.models import MODEL_CASES, export_case

    keras.utils.set_random_seed(0)
    directory.mkdir(parents=True, exist_ok=True)
    path = export_case(MODEL_CASES["encoder_multi_io"], directory)
    print(f"SavedModel at {path}")


def digests(saved_model: Path) -> dict[str, str]:
    from pe_export.api import export_onnx, export_tflite
    from pe_export.converters.options import ExportOptions
    from pe_export.errors import PeExportError
    from pe_export.tables.pipeline import TableOptions

    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for file_format, quantize, compress in EXPORTS:
            key = f"{file_format} {quantize}" + (f" --compress {compress}" if compress else "")
            options = replace(ExportOptions(quantize=quantize), tables=TableOptions(compress=compress))
            output = Path(folder) / f"model.{file_format}"
            export = export_tflite if file_format == "tflite" else export_onnx
            try:
                report = export(saved_model, output, replace(options, overwrite=True))
            except PeExportError as err:
                rows[key] = f"error: {err}"
                continue
            rows[key] = (
                hashlib.sha256(output.read_bytes()).hexdigest()
                if output.exists()
                else f"no file (exit {report.exit_code})"
            )
            print(f"{key:32} {rows[key]}", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("saved_model", type=Path, nargs="?")
    parser.add_argument("--build", type=Path, help="build the SavedModel into this folder and stop")
    parser.add_argument("--record", type=Path)
    parser.add_argument("--check", type=Path)
    args = parser.parse_args()
    if args.build:
        build(args.build)
        return 0
    rows = digests(args.saved_model)
    if args.record:
        args.record.write_text(json.dumps(rows, indent=1) + "\n")
    if args.check:
        before = json.loads(args.check.read_text())
        changed = [key for key in before if before[key] != rows.get(key)]
        for key in changed:
            print(f"CHANGED {key}: {before[key][:16]} -> {str(rows.get(key))[:16]}")
        print(f"{len(before) - len(changed)} of {len(before)} exports byte-identical")
        return 1 if changed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
