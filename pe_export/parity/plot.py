"""PNG of the per-position error profile (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pe_export.errors import missing_extra
from pe_export.parity.harness import ParityReport


def write_profile_plot(reports: list[tuple[str, ParityReport]], path: Path) -> None:
    """One line per (variant, output) with a position profile; written atomically."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise missing_extra("matplotlib", "plot") from err
    figure, axis = plt.subplots(figsize=(10, 4.5))
    for label, report in reports:
        for metrics in report.outputs:
            if metrics.position_max_abs:
                values = [max(v, 1e-12) if v == v else float("nan") for v in metrics.position_max_abs]
                axis.plot(range(len(values)), values, marker=".", label=f"{label}: {metrics.name}")
    axis.set_yscale("log")
    axis.set_xlabel("sequence position (padding excluded)")
    axis.set_ylabel("max abs error vs float32 TensorFlow")
    axis.set_title("pe-export parity: error by position")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    figure.tight_layout()
    descriptor, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=Path(path).parent)
    os.close(descriptor)
    try:
        figure.savefig(temp, dpi=110)
        os.replace(temp, path)
    finally:
        plt.close(figure)
        if os.path.exists(temp):
            os.unlink(temp)
