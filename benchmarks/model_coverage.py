"""Model coverage, side by side: per keras-hub encoder family, the position tables found, file bytes
plain and with `--compress 64`, max abs error against float32 TensorFlow per format, Flex ops and
export seconds.

    python benchmarks/model_coverage.py [--family bert ...]

The models are the tiny random-init backbones of tests/fixtures/keras_hub_models.py (what the
coverage test checks); every export is verified by pe-export itself (fp32 tolerance).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pe_export.api import export_onnx, export_tflite, find_position_tables  # noqa: E402
from pe_export.converters.options import ExportOptions  # noqa: E402
from pe_export.errors import PeExportError  # noqa: E402
from pe_export.native import import_tensorflow  # noqa: E402
from pe_export.tables.pipeline import TableOptions  # noqa: E402
from tests.fixtures.keras_hub_models import FAMILIES, export_family  # noqa: E402

EXPORTS = {"tflite": export_tflite, "onnx": export_onnx}


def measure(name: str, root: Path) -> dict[str, object]:
    case = FAMILIES[name]
    model = export_family(case, root)
    tables = find_position_tables(model, ExportOptions(seq_len=case.seq_len))
    row: dict[str, object] = {
        "family": name,
        "tables": ", ".join(sorted({f"{r.table.kind} {'x'.join(map(str, r.table.shape))}" for r in tables})) or "-",
        "count": len(tables),
        "table_bytes": sum(r.table.nbytes for r in tables),
    }
    for target, export in EXPORTS.items():
        for label, tables_options in (("plain", TableOptions()), ("c64", TableOptions(compress=64))):
            options = ExportOptions(seq_len=case.seq_len, tables=tables_options)
            start = time.perf_counter()
            try:
                report = export(model, root / f"{name}-{label}.{target}", options)
            except PeExportError as err:
                row[f"{target}_{label}"] = f"exit {int(err.exit_code)}"
                continue
            seconds = time.perf_counter() - start
            if report.parity is None:
                row[f"{target}_{label}"] = f"exit {int(report.exit_code)}"
                row[f"{target}_flex"] = ",".join(report.summary.flex_ops)
                continue
            row[f"{target}_{label}"] = report.summary.file_bytes
            row[f"{target}_{label}_err"] = report.parity.max_abs
            row[f"{target}_{label}_s"] = seconds
            if target == "tflite":
                row["tflite_flex"] = ",".join(report.summary.flex_ops) or "none"
            if label == "c64":
                row["stored"] = sum(t.bytes_after for t in report.tables)
    return row


def _cells(row: dict[str, object]) -> Callable[[str], str]:
    def cell(key: str) -> str:
        value = row.get(key, "-")
        return format(value, ",") if isinstance(value, int | float) else str(value)

    return cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", choices=list(FAMILIES))
    args = parser.parse_args()
    import_tensorflow()
    header = (
        f"{'family':<12} {'tables found':<28} {'n':>2} {'table B':>8} {'stored B':>8} {'tflite B':>10} "
        f"{'c64 B':>10} {'err':>8} {'onnx B':>10} {'c64 B':>10} {'err':>8} {'flex':<22} "
        f"{'export s':>8}"
    )
    print(header)
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.family or list(FAMILIES):
            row = measure(name, Path(scratch))
            cell = _cells(row)

            errors = [row[k] for k in ("tflite_plain_err", "tflite_c64_err") if k in row]
            onnx_errors = [row[k] for k in ("onnx_plain_err", "onnx_c64_err") if k in row]
            seconds = [row[k] for k in row if str(k).endswith("_s")]
            print(
                f"{name:<12} {row['tables'][:28]:<28} {row['count']:>2} {row['table_bytes']:>8,} "
                f"{cell('stored'):>8} {cell('tflite_plain'):>10} {cell('tflite_c64'):>10} "
                f"{(f'{max(errors):.1e}' if errors else '-'):>8} {cell('onnx_plain'):>10} {cell('onnx_c64'):>10} "
                f"{(f'{max(onnx_errors):.1e}' if onnx_errors else '-'):>8} {cell('tflite_flex'):<22} "
                f"{(f'{sum(seconds) / len(seconds):.1f}' if seconds else '-'):>8}",
                flush=True,
            )


if __name__ == "__main__":
    main()
