"""Sinusoid-family tables by value: every column is sin(p·w_c) or cos(p·w_c) (numpy only).

This covers the interleaved layout (sin, cos, sin, cos…), concatenated halves (sin… ‖ cos…),
any base (frequencies are recovered, not assumed), and rotary cos/sin caches (columns of
one kind, frequencies repeated). Recovery: column c at position 0 is 0 for sine and 1 for
cosine; position 1 gives |w_c| (arccos of the cosine, or through sin(2w) = 2 sin w cos w for
the sine, which also fixes the quadrant); then the whole column must match the formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A table counts as a sinusoid when it matches the formula this closely. Tables computed in
# float32 in-graph drift from the float64 formula by ~1e-7·p·w, hence not 1e-7.
SINUSOID_TOLERANCE = 1e-4
SIN, COS = 0, 1


@dataclass(frozen=True)
class SinusoidFit:
    frequencies: np.ndarray  # [d] angle per position for each column, float64
    phases: np.ndarray  # [d] SIN or COS per column
    max_error: float  # the stored table against the formula
    layout: str  # "interleaved", "halves", "cos-cache", "sin-cache", "mixed"

    @property
    def unique(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct frequencies [u], column → frequency index [d]); sin and cos of one pair share one."""
        return group_frequencies(self.frequencies)

    @property
    def base(self) -> float | None:
        """b when the distinct frequencies are exactly b^(-2i/d), i = 0 … u-1 (d = 2u)."""
        values = np.sort(self.unique[0])[::-1]
        if len(values) < 2 or not np.isclose(values[0], 1.0, atol=1e-6):
            return None
        exponents = 2 * np.arange(1, len(values)) / (2 * len(values))
        bases = np.exp(-np.log(values[1:]) / exponents)
        candidate = float(np.median(bases))
        return candidate if np.allclose(standard_frequencies(2 * len(values), candidate), values, rtol=1e-5) else None


def group_frequencies(frequencies: np.ndarray, rtol: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    """Cluster estimates that differ only by float32 noise; returns (means, column → cluster)."""
    order = np.argsort(frequencies)
    groups = np.zeros(len(frequencies), dtype=np.int64)
    means: list[list[float]] = []
    for column in order:
        value = frequencies[column]
        if means and abs(value - np.mean(means[-1])) <= rtol * max(abs(value), 1e-3):
            means[-1].append(value)
        else:
            means.append([value])
        groups[column] = len(means) - 1
    # Number clusters by the first column that uses them, so a standard layout maps to 0, 1, 2, ….
    first_use = {}
    for group in groups:
        first_use.setdefault(int(group), len(first_use))
    renumbered = np.array([first_use[int(g)] for g in groups], dtype=np.int64)
    values = np.empty(len(means))
    for old, new in first_use.items():
        values[new] = np.mean(means[old])
    return values, renumbered


def sinusoid_values(positions: np.ndarray, frequencies: np.ndarray, phases: np.ndarray) -> np.ndarray:
    """The formula in float64: [n] positions × [d] columns."""
    angles = np.asarray(positions, dtype=np.float64)[:, None] * frequencies[None, :]
    return np.where(phases[None, :] == SIN, np.sin(angles), np.cos(angles))


def standard_frequencies(width: int, base: float = 10000.0) -> np.ndarray:
    """w_i = base^(-2i/d) for each sin/cos pair, computed in float64."""
    return base ** (-np.arange(0, width, 2, dtype=np.float64) / width)


def sinusoid_table(length: int, width: int, base: float = 10000.0, layout: str = "interleaved") -> np.ndarray:
    """A reference table in float64: interleaved (sin, cos, …) or halves (sin… ‖ cos…)."""
    rates = standard_frequencies(width, base)
    angles = np.arange(length, dtype=np.float64)[:, None] * rates[None, :]
    if layout == "interleaved":
        table = np.empty((length, width))
        table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
        return table
    if layout == "halves":
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    raise ValueError(f"unknown layout {layout!r}")


def fit_sinusoid(table: np.ndarray, tolerance: float = SINUSOID_TOLERANCE) -> SinusoidFit | None:
    """Recover frequencies and phases of a [L, d] table, or None when it is not a sinusoid."""
    table = np.asarray(table, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] < 3 or table.shape[1] < 1 or not np.isfinite(table).all():
        return None
    first, second, third = table[0], table[1], table[2]
    phases = np.where(np.abs(first - 1.0) <= tolerance, COS, SIN)
    if not np.all((np.abs(first) <= tolerance) | (phases == COS)):
        return None
    frequencies = _refine(table, phases, _coarse(second, third, phases))
    frequencies = _snap_to_base(frequencies)
    error = float(np.max(np.abs(sinusoid_values(np.arange(table.shape[0]), frequencies, phases) - table)))
    if error > tolerance:
        return None
    return SinusoidFit(frequencies, phases, error, _layout(frequencies, phases))


def _snap_to_base(frequencies: np.ndarray) -> np.ndarray:
    """Where the frequencies are a base's b^(-2i/d), use the exact values (float64) instead of estimates."""
    fit = SinusoidFit(frequencies, np.zeros(len(frequencies), dtype=np.int64), 0.0, "")
    base = fit.base
    if base is None:
        return frequencies
    values, groups = fit.unique
    for candidate in (round(base), base):  # 10000.0002 is 10000
        exact = standard_frequencies(2 * len(values), float(candidate))
        nearest = exact[np.argmin(np.abs(exact[None, :] - values[:, None]), axis=1)]
        if np.allclose(nearest, values, rtol=1e-5):
            return nearest[groups]
    return frequencies


def _coarse(second: np.ndarray, third: np.ndarray, phases: np.ndarray) -> np.ndarray:
    """First estimate from rows 1 and 2: cos(w) for cosine columns; atan2 for sine columns,
    with cos(w) = sin(2w) / (2 sin(w))."""
    safe = np.where(np.abs(second) > 1e-6, second, 1.0)
    cos_of_sine = np.clip(np.where(np.abs(second) > 1e-6, third / (2.0 * safe), 1.0), -1.0, 1.0)
    return np.where(phases == COS, np.arccos(np.clip(second, -1.0, 1.0)), np.arctan2(second, cos_of_sine))


def _refine(table: np.ndarray, phases: np.ndarray, estimate: np.ndarray) -> np.ndarray:
    """Sharpen w at rows 2, 4, 8, …: the angle there is known up to its branch, and the
    current estimate picks the branch, so each doubling halves the error. Rows where the
    value is within 1e-4 of ±1 (angle ill-conditioned) keep the previous estimate; the last
    row ends the walk."""
    last = table.shape[0] - 1
    positions = [2**k for k in range(1, 64) if 2**k < last] + [last]
    for position in positions:
        value = np.clip(table[position], -1.0, 1.0)
        predicted = position * estimate
        if_cos = np.arccos(value)
        if_sin = np.arcsin(value)
        first = np.where(phases == COS, if_cos, if_sin)
        second = np.where(phases == COS, -if_cos, np.pi - if_sin)
        best = None
        for candidate in (first, second):
            turns = np.round((predicted - candidate) / (2 * np.pi))
            angle = candidate + 2 * np.pi * turns
            best = (
                angle if best is None else np.where(np.abs(angle - predicted) < np.abs(best - predicted), angle, best)
            )
        estimate = np.where(np.abs(value) < 0.9999, best / position, estimate)
    return estimate


def _layout(frequencies: np.ndarray, phases: np.ndarray) -> str:
    d = len(phases)
    if d % 2 == 0:
        if (
            np.all(phases[0::2] == SIN)
            and np.all(phases[1::2] == COS)
            and np.allclose(frequencies[0::2], frequencies[1::2])
        ):
            return "interleaved"
        half = d // 2
        if (
            np.all(phases[:half] == SIN)
            and np.all(phases[half:] == COS)
            and np.allclose(frequencies[:half], frequencies[half:])
        ):
            return "halves"
    if np.all(phases == COS):
        return "cos-cache"
    if np.all(phases == SIN):
        return "sin-cache"
    return "mixed"
