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

DEFAULT_DEMO_DIR = Path("pe-export-demo")
DEMO_SEQ_LEN = None  # keep the reference encoder's dynamic sequence axis

# (target, quantize) pairs the demo exports, in the order it prints them.
DEMO_VARIANTS: tuple[tuple[str, str], ...] = (
    ("tflite", "none"),
    ("tflite", "float16"),
    ("tflite", "dynamic-int8"),
    ("onnx", "none"),
    ("onnx", "float16"),
    ("onnx", "dynamic-int8"),
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
                    "runtime": parity.runtime if parity else None,
                    "max_abs_error": parity.max_abs if parity else None,
                    "min_cosine": parity.min_cosine if parity else None,
                    "verdict": "PASS" if report.exit_code == ExitCode.OK else report.exit_code.name,
                    "export_seconds": round(seconds, 2),
                }
            )
        return rows


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
    for target, quantize in DEMO_VARIANTS:
        name = f"{target} {'fp32' if quantize == 'none' else quantize}"
        say(f"exporting {name}")
        suffix = "" if quantize == "none" else f".{quantize}"
        output = directory / f"encoder{suffix}.{target}"
        export = export_tflite if target == "tflite" else export_onnx
        started = time.perf_counter()
        report = export(saved_model, output, ExportOptions(quantize=quantize, overwrite=True), quiet=quiet)
        result.reports.append((name, report, time.perf_counter() - started))
    (directory / "report.json").write_text(json.dumps({"variants": result.rows()}, indent=2))
    return result
