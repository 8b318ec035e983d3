"""Hugging Face TF and Keras 2 coverage, side by side: per family and way of saving, the tables found, the longest
sequence the model takes, and per format plain and `--compress 64` the exit code and the max abs error against
float32 TensorFlow measured independently (inputs of another seed than the export's, padded rows).

    python benchmarks/hf_coverage.py [--family roberta ...] [--how pretrained|signature]

The models are tests/fixtures/hf_models.py's tiny random-init encoders (transformers 4.x with tf-keras), built in
one Keras 2 child; model_coverage.py prints the keras-hub families the same way.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pe_export.api import export_onnx, export_tflite, find_position_tables  # noqa: E402
from pe_export.converters.options import ExportOptions  # noqa: E402
from pe_export.errors import PeExportError  # noqa: E402
from pe_export.lengths import model_limit  # noqa: E402
from pe_export.savedmodel import FrozenSignature, load_savedmodel, signature_input_specs  # noqa: E402
from pe_export.tables.pipeline import TableOptions  # noqa: E402
from tests.fixtures.hf_models import ALL, HOWS, KERAS2, build_in_child  # noqa: E402
from tests.test_hf_models import _independent_error  # noqa: E402

EXPORTS = {"tflite": (export_tflite, "litert"), "onnx": (export_onnx, "onnxruntime")}


def measure(saved_model: Path, root: Path, stem: str) -> dict[str, str]:
    loaded = load_savedmodel(saved_model)
    signature = loaded.signature(None)
    limit = model_limit(loaded, FrozenSignature(signature, signature_input_specs(signature)))
    tables = find_position_tables(saved_model, ExportOptions())
    row = {
        "tables": ", ".join(sorted({r.table.kind for r in tables})) or "-",
        "limit": "-" if limit is None else f"{limit.tokens}/{limit.rows}",
    }
    for target, (export, runtime) in EXPORTS.items():
        for label, compress in (("plain", None), ("c64", 64)):
            output = root / f"{stem}-{label}.{target}"
            try:
                report = export(saved_model, output, ExportOptions(tables=TableOptions(compress=compress)))
            except PeExportError as err:
                row[f"{target}_{label}"] = f"exit {int(err.exit_code)}"
                continue
            if report.parity is None:
                row[f"{target}_{label}"] = f"exit {int(report.exit_code)} ({','.join(report.summary.flex_ops)})"
                continue
            row[f"{target}_{label}"] = f"{_independent_error(saved_model, output, runtime):.1e}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", choices=ALL)
    parser.add_argument("--how", action="append", choices=HOWS)
    args = parser.parse_args()
    wanted = [
        (family, how)
        for family in args.family or ALL
        for how in (("pretrained",) if family in KERAS2 else args.how or HOWS)
    ]
    columns = ("tflite_plain", "tflite_c64", "onnx_plain", "onnx_c64")
    print(f"{'family':<16} {'saved':<10} {'tables':<30} {'tokens':>7} " + " ".join(f"{c:>13}" for c in columns))
    with tempfile.TemporaryDirectory() as scratch:
        models = build_in_child(wanted, Path(scratch))
        for (family, how), path in models.items():
            row = measure(path, Path(scratch), f"{family}-{how}")
            cells = " ".join(f"{row.get(c, '-'):>13}" for c in columns)
            print(f"{family:<16} {how:<10} {row['tables'][:30]:<30} {row['limit']:>7} {cells}", flush=True)


if __name__ == "__main__":
    main()
