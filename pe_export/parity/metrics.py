"""Error statistics for one output against its reference, accumulated batch by batch.

Accumulating keeps memory bounded when a bundle is streamed; a single comparison is one
update. Padded positions (``valid`` False) are left out of every statistic: nothing
downstream reads what an encoder computes there.
"""

from __future__ import annotations

import numpy as np

from pe_export.parity.result import OutputMetrics
from pe_export.parity.tolerances import Tolerance

_TINY = 1e-12
# Outputs whose last axis is a class or vocabulary axis, recognised by name: a hint that decides only whether
# argmax agreement is reported (a statistic beside the verdict, never part of it). Every check that decides
# the verdict applies to every output alike, whatever it is called.
CLASS_AXIS_WORDS = ("logit", "prob", "score", "class")


def has_class_axis(name: str) -> bool:
    return any(word in name.lower() for word in CLASS_AXIS_WORDS)


def _valid_along(shape: tuple[int, ...], valid: np.ndarray | None, axes: tuple[int, ...]) -> np.ndarray:
    """Which elements of a tensor of ``shape`` (batch first) count: those whose position on every axis of ``axes``
    is valid (``valid`` [batch, seq]); every element where the mask does not fit those axes."""
    include = np.ones(shape, dtype=bool)
    if valid is None or not axes or valid.ndim != 2 or shape[:1] != valid.shape[:1]:
        return include
    if any(axis >= len(shape) or shape[axis] != valid.shape[1] for axis in axes):
        return include
    for axis in axes:
        along = [1] * len(shape)
        along[0], along[axis] = valid.shape[0], valid.shape[1]
        include = include & valid.astype(bool).reshape(along)
    return include


class OutputAccumulator:
    """Running statistics for one output across batches."""

    def __init__(
        self,
        name: str,
        tolerance: Tolerance,
        *,
        argmax: bool | None = None,
        case: str | None = None,
        sequence: bool | None = None,
        sequence_axes: tuple[int, ...] = (1,),
    ) -> None:
        """``sequence``: whether the output's axis 1 is the sequence axis (the padding mask applies), from the
        signature (``specs.sequence_outputs``); None where it is not known (a bundle written before it was
        recorded), and then the mask applies where its shape covers the output's first two axes.
        ``sequence_axes``: the axes that run along the sequence where those are others (a layer's attention
        scores [batch, heads, query, key]): an element counts where every one of its positions is valid."""
        self.name = name
        self.sequence = sequence
        self.sequence_axes = sequence_axes
        self.case = case
        self.tolerance = tolerance
        self.argmax = has_class_axis(name) if argmax is None else argmax
        self.shape: tuple[int, ...] = ()
        self.compared = 0
        self.sum_abs = 0.0
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.worst_index: tuple[int, ...] = ()
        self.dot = self.norm_actual = self.norm_expected = 0.0
        self.nan_count = self.inf_count = self.violations = 0
        self.argmax_equal = self.argmax_total = 0
        self.position_max: np.ndarray | None = None
        self.samples = 0
        self.labelled = self.correct = self.reference_correct = 0
        self.pooled_worst: float | None = None

    def update(
        self,
        actual: np.ndarray,
        expected: np.ndarray,
        valid: np.ndarray | None = None,
        labels: np.ndarray | None = None,
    ) -> None:
        a = np.asarray(actual, dtype=np.float64)
        e = np.asarray(expected, dtype=np.float64)
        if a.shape != e.shape:
            raise ValueError(f"output {self.name!r}: shape {a.shape} does not match reference {e.shape}")
        # The padding mask applies along the sequence axes (axis 1 of an output), where it covers [batch, seq].
        axes = self.sequence_axes if self.sequence is not False else ()
        include = _valid_along(a.shape, valid, axes)
        fits = valid is not None and a.ndim >= 2 and a.shape[:2] == valid.shape
        mask = valid if fits and axes == (1,) else None  # [batch, seq] statistics: positions, pooled rows
        nan = np.isnan(a) & include
        inf = np.isinf(a) & include
        finite = include & ~nan & ~inf
        error = np.abs(a - e)
        self.nan_count += int(nan.sum())
        self.inf_count += int(inf.sum())
        self.compared += int(include.sum())
        self.sum_abs += float(error[finite].sum())
        allowed = self.tolerance.atol + self.tolerance.rtol * np.abs(e)
        self.violations += int(((error > allowed) & finite).sum()) + int(nan.sum() + inf.sum())
        if finite.any():
            masked = np.where(finite, error, -1.0)
            flat = int(np.argmax(masked))
            if masked.flat[flat] > self.max_abs or not self.worst_index:
                self.max_abs = max(self.max_abs, float(masked.flat[flat]))
                index = np.unravel_index(flat, a.shape)
                self.worst_index = (self.samples + int(index[0]), *(int(i) for i in index[1:])) if a.ndim else ()
            self.max_rel = max(self.max_rel, float((error[finite] / np.maximum(np.abs(e[finite]), _TINY)).max()))
            self.dot += float((a[finite] * e[finite]).sum())
            self.norm_actual += float((a[finite] ** 2).sum())
            self.norm_expected += float((e[finite] ** 2).sum())
        if self.argmax and a.ndim >= 2:
            self._update_argmax(a, e, mask)
        if mask is not None:
            self._update_positions(np.where(finite, error, 0.0), mask)
        if mask is not None and a.ndim == 3:  # every masked sequence output, whatever its name
            self._update_pooled(a, e, mask)
        if labels is not None:
            self._update_labels(a, e, labels, valid)
        self.shape = a.shape[1:]
        self.samples += a.shape[0] if a.ndim else 1

    def _update_argmax(self, a: np.ndarray, e: np.ndarray, mask: np.ndarray | None) -> None:
        agree = np.argmax(a, axis=-1) == np.argmax(e, axis=-1)
        rows = mask if mask is not None and a.ndim >= 3 else np.ones(agree.shape, dtype=bool)
        self.argmax_equal += int((agree & rows).sum())
        self.argmax_total += int(rows.sum())

    def _update_positions(self, error: np.ndarray, mask: np.ndarray) -> None:
        per_position = error.reshape(error.shape[0], error.shape[1], -1).max(axis=(0, 2))
        per_position = np.where(mask.any(axis=0), per_position, np.nan)
        self.position_max = per_position if self.position_max is None else np.fmax(self.position_max, per_position)

    def _update_pooled(self, a: np.ndarray, e: np.ndarray, mask: np.ndarray) -> None:
        weights = mask[:, :, None].astype(np.float64)
        count = np.maximum(weights.sum(axis=1), 1.0)
        pooled_a, pooled_e = (a * weights).sum(axis=1) / count, (e * weights).sum(axis=1) / count
        norm_a, norm_e = np.linalg.norm(pooled_a, axis=1), np.linalg.norm(pooled_e, axis=1)
        rows = (pooled_a * pooled_e).sum(axis=1) / np.maximum(norm_a * norm_e, _TINY)
        rows = np.where((norm_a == 0) & (norm_e == 0), 1.0, rows)  # as the flattened cosine: 0 matches 0
        rows = np.where(np.isfinite(rows), rows, -1.0)[mask.any(axis=1)]  # a row with no token has no mean
        if rows.size:
            worst = float(rows.min())
            self.pooled_worst = worst if self.pooled_worst is None else min(self.pooled_worst, worst)

    def _update_labels(self, a: np.ndarray, e: np.ndarray, labels: np.ndarray, valid: np.ndarray | None) -> None:
        counted = labels >= 0
        if valid is not None and labels.shape == valid.shape:
            counted &= valid
        self.labelled += int(counted.sum())
        self.correct += int(((np.argmax(a, axis=-1) == labels) & counted).sum())
        self.reference_correct += int(((np.argmax(e, axis=-1) == labels) & counted).sum())

    @property
    def cosine(self) -> float:
        if self.nan_count or self.inf_count:
            return float("nan")
        norms = np.sqrt(self.norm_actual) * np.sqrt(self.norm_expected)
        if norms == 0:
            return 1.0 if self.norm_actual == self.norm_expected else 0.0
        return float(self.dot / norms)

    def result(self) -> OutputMetrics:
        cosine = self.cosine
        return OutputMetrics(
            name=self.name,
            shape=(self.samples, *self.shape),
            max_abs=self.max_abs,
            mean_abs=self.sum_abs / max(1, self.compared - self.nan_count - self.inf_count),
            max_rel=self.max_rel,
            cosine=cosine,
            nan_count=self.nan_count,
            inf_count=self.inf_count,
            worst_index=self.worst_index,
            # A masked sequence output also answers for its worst row's mean-pooled direction (a sentence
            # embedding): one short sentence can go wrong while the batch's flattened cosine stays high.
            within_tolerance=bool(
                self.violations == 0
                and cosine >= self.tolerance.min_cosine
                and (self.pooled_worst is None or self.pooled_worst >= self.tolerance.min_cosine)
            ),
            compared=self.compared,
            violations=self.violations,
            argmax_agreement=self.argmax_equal / self.argmax_total if self.argmax_total else None,
            position_max_abs=None if self.position_max is None else tuple(float(x) for x in self.position_max),
            task_accuracy=self.correct / self.labelled if self.labelled else None,
            reference_accuracy=self.reference_correct / self.labelled if self.labelled else None,
            pooled_cosine=self.pooled_worst,
            case=self.case,
        )


def compare_output(
    name: str,
    actual: np.ndarray,
    expected: np.ndarray,
    tolerance: Tolerance,
    valid: np.ndarray | None = None,
    sequence: bool | None = None,
) -> OutputMetrics:
    """One comparison: statistics of ``actual`` against ``expected`` (shapes must match)."""
    accumulator = OutputAccumulator(name, tolerance, sequence=sequence)
    accumulator.update(actual, expected, valid)
    return accumulator.result()
