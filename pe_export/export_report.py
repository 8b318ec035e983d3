"""What an export did: the file, its verification, the tables and searches, and its exit code."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pe_export.converters.options import ExportOptions
from pe_export.errors import ExitCode, ParityError, RuntimeUnavailableError
from pe_export.inspection.summary import ModelSummary
from pe_export.parity.result import ParityReport
from pe_export.specs import TensorSpec

if TYPE_CHECKING:
    from pe_export.parity.result import OutputMetrics
    from pe_export.tables.pipeline import TableResult


@dataclass
class ExportReport:
    file_format: str  # "tflite" or "onnx"
    source: Path
    output: Path
    signature: str
    input_specs: list[TensorSpec]
    options: ExportOptions
    summary: ModelSummary
    parity: ParityReport | None = None
    unverified_reason: str | None = None
    converter_log: str = ""
    tables: list[TableResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the exporter changed to make the file run
    written: bool = True  # False: the file failed verification and nothing was put at ``output``
    kept_failed: Path | None = None  # --keep-failed: where the failing file was kept instead
    # --allow-lossy: the file against the model with its compressed tables (lossy_reference.py), where the
    # parity against the model as it is failed: the loss accepted is the tables' alone
    against_lossy_tables: list[OutputMetrics] | None = None
    layer_map: str | None = None  # what the stamped layer map covers, or why there is none (pe_export/parity/layers)
    # the accuracy-driven searches that chose what stays float, each with its measured ranking (search/keep_float.py)
    searches: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The report as --json writes it: what was asked, what was written, what was decided and why, and
        the parity report (``ParityReport.to_dict``)."""
        from dataclasses import asdict

        return {
            "format": self.file_format,
            "source": str(self.source),
            "output": str(self.output),
            "written": self.written,
            "kept_failed": None if self.kept_failed is None else str(self.kept_failed),
            "exit_code": int(self.exit_code),
            "signature": self.signature,
            "inputs": [spec.describe() for spec in self.input_specs],
            "quantize": self.options.quantize,
            "precision": self.options.precision,
            "tolerance": asdict(self.options.tolerance),
            "file_bytes": self.summary.file_bytes,
            "notes": list(self.notes),
            "tables": [
                {
                    "name": result.table.name,
                    "method": result.method,
                    "exact": result.exact,
                    "bytes_before": result.bytes_before,
                    "bytes_after": result.bytes_after,
                    "max_error": result.max_error,
                }
                for result in self.tables
            ],
            "searches": self.searches,
            "layer_map": self.layer_map,
            "parity": None if self.parity is None else self.parity.to_dict(),
            "unverified_reason": self.unverified_reason,
        }

    @property
    def lossy_tables(self) -> list[TableResult]:
        return [t for t in self.tables if not t.exact]

    @property
    def loss_is_the_tables(self) -> bool:
        """--allow-lossy with lossy tables, and the file meets its tolerance against the model computed with
        them: what parity misses is the tables' loss, which the user accepted."""
        checked = self.against_lossy_tables or []
        accepted = bool(self.lossy_tables and self.options.tables.allow_lossy and checked)
        return accepted and all(output.within_tolerance for output in checked)

    @property
    def exit_code(self) -> ExitCode:
        if self.parity is not None and not self.parity.passed:
            return ExitCode.OK if self.loss_is_the_tables else ExitCode.PARITY_FAILED
        if self.options.verify and self.parity is None:
            return ExitCode.RUNTIME_UNAVAILABLE
        return ExitCode.OK

    def raise_for_status(self) -> None:
        """Raise the error that the exit code stands for; return quietly when it is OK."""
        if self.exit_code == ExitCode.PARITY_FAILED:
            assert self.parity is not None
            lossy = ", ".join(f"{t.table.name} ({t.method}, table error {t.max_error:.3g})" for t in self.lossy_tables)
            if self.kept_failed is not None:
                what = f"{self.output} was not written; the failing file is kept as {self.kept_failed} (--keep-failed):"
            else:
                what = (
                    f"{self.output} was not written (--keep-failed keeps a failing file as "
                    f"{failed_output_path(self.output).name}):"
                )
            if lossy and self.options.tables.allow_lossy:
                worst = min(self.against_lossy_tables or [], key=lambda o: (o.within_tolerance, o.cosine), default=None)
                beyond = (
                    f"{worst.name!r} errs {worst.max_abs:.3g} (cosine {worst.cosine:.6f})" if worst is not None else "?"
                )
                raise ParityError(
                    f"{what} --allow-lossy accepts the tables' loss only ({lossy}), and against the model computed "
                    f"with those tables the file still fails the {self.options.precision} tolerance: {beyond}. The "
                    "rest is the file's own (its precision or the converter's): try another --quantize, or verify "
                    "without --compress to see it alone"
                )
            if lossy:
                raise ParityError(
                    f"{what} lossy table compression breaks parity ({lossy}): {self.parity.failure_message()}. "
                    "Use a larger --compress, --compress-method angle where the table is a sinusoid, or --allow-lossy"
                )
            raise ParityError(f"{what} {self.parity.failure_message()}")
        if self.exit_code == ExitCode.RUNTIME_UNAVAILABLE:
            raise RuntimeUnavailableError(
                f"{self.output} was written but not verified: {self.unverified_reason}; pass --no-verify to "
                "accept it unverified, or run `pe-export parity` where a suitable runtime is installed"
            )


def failed_output_path(output: Path) -> Path:
    """Where --keep-failed keeps a file that failed verification: the name says so."""
    output = Path(output)
    return output.with_name(f"{output.stem}.FAILED{output.suffix}")
