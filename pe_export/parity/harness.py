"""`pe-export parity`: check an exported file against a golden bundle (no TensorFlow needed).

``check_parity`` runs the check in a child process by default (pe_export/parity/supervisor.py), so that a
runtime that crashes or hangs is reported, not fatal; with ``isolate=False`` it runs here
(pe_export/parity/inprocess.py). This module imports neither numpy nor a runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pe_export.parity.result import ParityAssertionError, ParityOptions, ParityReport

__all__ = ["ParityAssertionError", "ParityOptions", "ParityReport", "assert_parity", "check_parity"]


def check_parity(model: Path, bundle_path: Path, options: ParityOptions | None = None) -> ParityReport:
    """Check ``model`` against the bundle: in a child process unless ``options.isolate`` is False."""
    options = options or ParityOptions()
    options.validate()
    if options.isolate:
        from pe_export.parity.supervisor import check_in_child

        return check_in_child(Path(model), Path(bundle_path), options)
    from pe_export.parity.inprocess import run_check

    return run_check(Path(model), Path(bundle_path), options)


def assert_parity(model: Path | str, golden: Path | str, **options: Any) -> ParityReport:
    """For pytest and CI: raise ParityAssertionError (an AssertionError) with the report when it fails."""
    from pe_export.parity.text import format_parity_report

    report = check_parity(Path(model), Path(golden), ParityOptions(**options))
    if not report.passed:
        raise ParityAssertionError(report.failure_message() + "\n" + "\n".join(format_parity_report(report)))
    return report
