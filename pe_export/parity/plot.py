"""PNG of the per-position error profile (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pe_export.errors import BadInputError, missing_extra
from pe_export.fileio import check_output_path, publish, staged_file
from pe_export.parity.result import ParityReport


def check_plot_output(path: Path, *, overwrite: bool) -> None:
    """Before any work: --plot needs matplotlib and a .png path that can be written."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BadInputError(
            f"--plot {path}: matplotlib is not installed; install it with: "
            "pip install 'pe-export[plot]', or drop --plot"
        ) from None
    check_output_path(path, overwrite=overwrite, suffix=".png", flag="--plot")


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend; the extra named where it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise missing_extra("matplotlib", "plot") from err
    return plt


def save_png(figure: Any, path: Path, *, overwrite: bool) -> None:
    """The figure as a PNG at ``path``, staged and renamed (never half-written), then closed."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    try:
        with staged_file(Path(path)) as temp:
            figure.savefig(temp, dpi=110, format="png")
            publish(temp, Path(path), overwrite=overwrite)
    finally:
        plt.close(figure)


def write_profile_plot(reports: list[tuple[str, ParityReport]], path: Path, *, overwrite: bool = True) -> None:
    """One line per (variant, output) with a position profile; written atomically."""
    figure, axis = pyplot().subplots(figsize=(10, 4.5))
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
    save_png(figure, path, overwrite=overwrite)
