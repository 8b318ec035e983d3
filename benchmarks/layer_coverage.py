"""Layer-wise parity, side by side, per keras-hub encoder family: the layers `golden --layers all` finds, how many
the exported file's map carries (proven on its float32 file by values), and `parity --layers` on that file — the
worst relative error of any compared layer and the first layer over tolerance — per format, faithful (fp32) and
dynamic-int8.

    python benchmarks/layer_coverage.py [--family bert ...] [--quantize none,dynamic-int8]

The models are the tiny random-init backbones of tests/fixtures/keras_hub_models.py (the coverage test's).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pe_export.api import export_onnx, export_tflite  # noqa: E402
from pe_export.converters.options import ExportOptions  # noqa: E402
from pe_export.errors import PeExportError  # noqa: E402
from pe_export.golden import GoldenOptions, make_golden  # noqa: E402
from pe_export.parity.harness import ParityOptions, check_parity  # noqa: E402
from tests.fixtures.keras_hub_models import FAMILIES, export_family  # noqa: E402

EXPORTS = {"tflite": export_tflite, "onnx": export_onnx}
SEQ_LEN = 16


def measure(name: str, root: Path, modes: list[str]) -> list[list[str]]:
    case = FAMILIES[name]
    model = export_family(case, root)
    seq_len = case.seq_len or SEQ_LEN
    bundle = root / f"{name}.golden"
    try:
        golden = make_golden(model, bundle, GoldenOptions(samples=4, batch=2, seq_len=seq_len, layers="all"))
    except PeExportError as err:
        return [[name, "-", "-", "-", "-", "-", "-", f"golden: {err}"[:60]]]
    rows = []
    for file_format, export in EXPORTS.items():
        for quantize in modes:
            path = root / f"{name}.{quantize}.{file_format}"
            try:
                report = export(model, path, ExportOptions(seq_len=seq_len, quantize=quantize))
                parity = check_parity(path, bundle, ParityOptions(layers=True, isolate=False))
            except PeExportError as err:
                rows.append([name, file_format, quantize, str(golden.layers), "-", "-", "-", str(err)[:60]])
                continue
            layers = parity.layers
            assert layers is not None
            worst = max((layer.relative_error for layer in layers.layers), default=0.0)
            rows.append(
                [
                    name,
                    file_format,
                    quantize,
                    str(golden.layers),
                    str(len(layers.layers)),
                    f"{worst:.2e}",
                    layers.first_divergence or "none",
                    "outputs pass" if all(m.within_tolerance for m in parity.outputs) else "outputs FAIL",
                ]
            )
            del report
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", choices=list(FAMILIES), default=None)
    parser.add_argument("--quantize", default="none,dynamic-int8")
    args = parser.parse_args()
    head = ["family", "format", "quantize", "layers", "compared", "worst rel err", "first divergence", "outputs"]
    rows = [head]
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.family or list(FAMILIES):
            rows.extend(measure(name, Path(scratch), args.quantize.split(",")))
            print("  " + " | ".join(rows[-1]), file=sys.stderr, flush=True)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
