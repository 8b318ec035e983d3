"""`pe-export demo`: the whole export path on the bundled reference encoder, in one command."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pe_export.api import ExportReport, export_onnx, export_tflite
from pe_export.converters.options import ExportOptions
from pe_export.errors import BadInputError, ExitCode
from pe_export.tables.pipeline import TableOptions

DEFAULT_DEMO_DIR = Path("pe-export-demo")
DEMO_SEQ_LEN = None  # keep the reference encoder's dynamic sequence axis

DEMO_COMPRESS = 16  # the reference table is 64x32: a budget under 32 values per position
# (name, target, quantize, table options) in the order the demo prints them. The last one is
# the source write-up's lossy recipe, kept as a visible counter-example (--allow-lossy).
DEMO_VARIANTS: tuple[tuple[str, str, str, TableOptions], ...] = (
    ("tflite fp32", "tflite", "none", TableOptions()),
    ("tflite float16", "tflite", "float16", TableOptions()),
    ("tflite dynamic-int8", "tflite", "dynamic-int8", TableOptions()),
    ("onnx fp32", "onnx", "none", TableOptions()),
    ("onnx float16", "onnx", "float16", TableOptions()),
    ("onnx dynamic-int8", "onnx", "dynamic-int8", TableOptions()),
    ("tflite compress 16", "tflite", "none", TableOptions(compress=DEMO_COMPRESS)),
    ("onnx compress 16", "onnx", "none", TableOptions(compress=DEMO_COMPRESS)),
    ("tflite seed interp", "tflite", "none", TableOptions(compress=8, method="interp", allow_lossy=True)),
)


@dataclass
class DemoResult:
    directory: Path
    saved_model: Path
    reports: list[tuple[str, ExportReport, float]]  # (variant name, report, seconds)

    @property
    def exit_code(self) -> ExitCode:
        codes = [report.exit_code for _, report, _ in self.reports]
        return max(codes, default=ExitCode.OK)

    def rows(self) -> list[dict[str, object]]:
        rows = []
        for name, report, seconds in self.reports:
            parity = report.parity
            rows.append(
                {
                    "variant": name,
                    "file": report.output.name,
                    "file_bytes": report.summary.file_bytes,
                    "constant_bytes": report.summary.constant_bytes,
                    "table_bytes": sum(t.bytes_after for t in report.tables) if report.tables else None,
                    "table_max_error": max((t.max_error for t in report.tables), default=None),
                    "runtime": parity.runtime if parity else None,
                    "max_abs_error": parity.max_abs if parity else None,
                    "min_cosine": parity.min_cosine if parity else None,
                    "verdict": _verdict(report),
                    "export_seconds": round(seconds, 2),
                }
            )
        return rows


def _verdict(report: ExportReport) -> str:
    if report.exit_code != ExitCode.OK:
        return report.exit_code.name
    if report.parity is not None and not report.parity.passed:
        return "LOSSY (accepted)"
    return "PASS"


def run_demo(
    directory: Path = DEFAULT_DEMO_DIR, *, progress: Callable[[str], None] | None = None, quiet: bool = True
) -> DemoResult:
    """Build the reference encoder, export every variant with verification, write report.json."""
    from pe_export.native import import_tensorflow
    from pe_export.reference.encoder import build_encoder

    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise BadInputError(f"--out {directory} is a file; expected a directory for the demo's outputs")
    directory.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda _message: None)
    import_tensorflow()
    saved_model = directory / "reference_encoder"
    if not saved_model.exists():
        say("building the reference encoder SavedModel")
        build_encoder(DEMO_SEQ_LEN, multi_io=True).export(str(saved_model), verbose=False)
    result = DemoResult(directory, saved_model, [])
    for name, target, quantize, tables in DEMO_VARIANTS:
        say(f"exporting {name}")
        output = directory / f"encoder.{name.split(' ', 1)[1].replace(' ', '-')}.{target}"
        export = export_tflite if target == "tflite" else export_onnx
        started = time.perf_counter()
        options = ExportOptions(quantize=quantize, overwrite=True, tables=tables)
        report = export(saved_model, output, options, quiet=quiet)
        result.reports.append((name, report, time.perf_counter() - started))
    (directory / "report.json").write_text(json.dumps({"variants": result.rows()}, indent=2))
    return result
