"""Error statistics for one output against its reference."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pe_export.parity.tolerances import Tolerance

_TINY = 1e-12


@dataclass(frozen=True)
class OutputMetrics:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    mean_abs: float
    max_rel: float
    cosine: float
    nan_count: int
    inf_count: int
    worst_index: tuple[int, ...]
    within_tolerance: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_output(
    name: str, actual: np.ndarray, expected: np.ndarray, tolerance: Tolerance, valid: np.ndarray | None = None
) -> OutputMetrics:
    """Statistics of ``actual`` against ``expected``; shapes must already match.

    ``valid`` ([batch, seq] booleans) drops padded positions from outputs that have a
    sequence axis: what an encoder computes at a padded position is never consumed.
    """
    actual64 = np.asarray(actual, dtype=np.float64)
    expected64 = np.asarray(expected, dtype=np.float64)
    if actual64.shape != expected64.shape:
        raise ValueError(f"output {name!r}: shape {actual64.shape} does not match reference {expected64.shape}")
    if valid is not None and actual64.shape[:2] == valid.shape:
        actual64, expected64 = actual64[valid], expected64[valid]
    nan_count = int(np.isnan(actual64).sum())
    inf_count = int(np.isinf(actual64).sum())
    error = np.abs(actual64 - expected64)
    finite = np.isfinite(error)
    safe_error = np.where(finite, error, np.inf)
    if error.size == 0:
        return OutputMetrics(name, actual64.shape, 0.0, 0.0, 0.0, 1.0, 0, 0, (), True)
    worst = np.unravel_index(int(np.argmax(safe_error)), error.shape)
    relative = safe_error / np.maximum(np.abs(expected64), _TINY)
    flat_a, flat_e = actual64.ravel(), expected64.ravel()
    if finite.all():
        norms = np.linalg.norm(flat_a) * np.linalg.norm(flat_e)
        cosine = float(np.dot(flat_a, flat_e) / norms) if norms > 0 else float(np.array_equal(flat_a, flat_e))
    else:
        cosine = float("nan")
    within = bool(
        finite.all()
        and np.all(error <= tolerance.atol + tolerance.rtol * np.abs(expected64))
        and cosine >= tolerance.min_cosine
    )
    return OutputMetrics(
        name=name,
        shape=tuple(int(d) for d in actual64.shape),
        max_abs=float(np.max(safe_error)),
        mean_abs=float(np.mean(np.where(finite, error, 0.0))),
        max_rel=float(np.max(relative)),
        cosine=cosine,
        nan_count=nan_count,
        inf_count=inf_count,
        worst_index=tuple(int(i) for i in worst),
        within_tolerance=within,
    )
