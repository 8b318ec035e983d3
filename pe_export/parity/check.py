"""Run the reference and the exported file on the same feeds and compare every output."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pe_export.errors import ParityError
from pe_export.parity.metrics import OutputMetrics, compare_output
from pe_export.parity.tolerances import Tolerance
from pe_export.runners.base import Runner


@dataclass
class CaseResult:
    case: str
    outputs: list[OutputMetrics]


@dataclass
class ParityResult:
    runtime: str
    precision: str
    tolerance: Tolerance
    cases: list[CaseResult] = field(default_factory=list)
    positions: int | None = None  # sequence length the check ran at (None: no sequence axis)

    @property
    def passed(self) -> bool:
        return all(m.within_tolerance for case in self.cases for m in case.outputs)

    @property
    def max_abs(self) -> float:
        return max((m.max_abs for case in self.cases for m in case.outputs), default=0.0)

    @property
    def min_cosine(self) -> float:
        return min((m.cosine for case in self.cases for m in case.outputs), default=1.0)

    def failures(self) -> list[tuple[str, OutputMetrics]]:
        return [(c.case, m) for c in self.cases for m in c.outputs if not m.within_tolerance]

    def to_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "precision": self.precision,
            "tolerance": vars(self.tolerance),
            "passed": self.passed,
            "max_abs": self.max_abs,
            "min_cosine": self.min_cosine,
            "cases": [{"case": c.case, "outputs": [m.to_dict() for m in c.outputs]} for c in self.cases],
        }


def compare_runners(
    reference: Runner,
    candidate: Runner,
    feeds: dict[str, dict[str, np.ndarray]],
    *,
    precision: str,
    tolerance: Tolerance,
    valid: dict[str, np.ndarray] | None = None,
) -> ParityResult:
    """Both runners must be active. Raises ParityError when the outputs do not even line up.

    ``valid`` maps a case to its [batch, seq] mask of real (unpadded) positions.
    """
    result = ParityResult(candidate.describe(), precision, tolerance)
    shaped = [array.shape for feed in feeds.values() for array in feed.values() if np.ndim(array) >= 2]
    result.positions = int(shaped[0][1]) if shaped else None
    for case, feed in feeds.items():
        expected = reference.infer(feed)
        actual = candidate.infer(feed)
        missing = sorted(set(expected) - set(actual))
        if missing:
            raise ParityError(
                f"the exported file lacks outputs {', '.join(missing)} (it has: {', '.join(sorted(actual))})"
            )
        metrics = []
        for name in sorted(expected):
            if np.shape(actual[name]) != np.shape(expected[name]):
                raise ParityError(
                    f"output {name!r} has shape {np.shape(actual[name])} in the exported file and "
                    f"{np.shape(expected[name])} in the reference ({case} inputs)"
                )
            mask = None if valid is None else valid.get(case)
            metrics.append(compare_output(name, actual[name], expected[name], tolerance, mask))
        result.cases.append(CaseResult(case, metrics))
    return result
