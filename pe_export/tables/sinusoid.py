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
    groups: np.ndarray  # [d] column → index into shared
    shared: np.ndarray  # [u] distinct frequencies; sin and cos of one pair share one

    @property
    def unique(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct frequencies [u], column → frequency index [d])."""
        return self.shared, self.groups

    @property
    def base(self) -> float | None:
        """b when the distinct frequencies are exactly b^(-2i/d), i = 0 … u-1 (d = 2u)."""
        values = np.sort(self.unique[0])[::-1]
        if len(values) < 2 or not np.isclose(values[0], 1.0, atol=1e-6) or values[-1] <= 0:
            return None
        exponents = 2 * np.arange(1, len(values)) / (2 * len(values))
        bases = np.exp(-np.log(values[1:]) / exponents)
        candidate = float(np.median(bases))
        return candidate if np.allclose(standard_frequencies(2 * len(values), candidate), values, rtol=1e-5) else None


def group_columns(
    table: np.ndarray, frequencies: np.ndarray, phases: np.ndarray, errors: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Let columns share a frequency when one value fits them all about as well as their own.

    A low-frequency cosine is poorly conditioned (it barely leaves 1), so its own estimate can
    differ from its sine partner's by more than float noise while both fit the table; the
    shared value is the estimates' mean weighted by each column's sensitivity to w.
    """
    positions = np.arange(table.shape[0], dtype=np.float64)
    weights = (
        np.array(
            [
                float(((positions * (np.cos if phase == SIN else np.sin)(positions * w)) ** 2).sum())
                for w, phase in zip(frequencies, phases, strict=True)
            ]
        )
        + 1e-30
    )
    order = np.argsort(frequencies)
    clusters: list[list[int]] = []
    values: list[float] = []
    for column in order:
        if clusters:
            members = [*clusters[-1], column]
            candidate = float(np.average(frequencies[members], weights=weights[members]))
            allowed = max(1e-6, 1.5 * float(errors[members].max()))
            fitted = sinusoid_values(positions, np.full(len(members), candidate), phases[members])
            if np.abs(fitted - table[:, members]).max() <= allowed:
                clusters[-1], values[-1] = members, candidate
                continue
        clusters.append([column])
        values.append(float(frequencies[column]))
    # Number clusters by the first column that uses them, so a standard layout maps to 0, 1, 2, ….
    groups = np.zeros(len(frequencies), dtype=np.int64)
    for index, members in enumerate(clusters):
        groups[members] = index
    first_use: dict[int, int] = {}
    for group in groups:
        first_use.setdefault(int(group), len(first_use))
    renumbered = np.array([first_use[int(g)] for g in groups], dtype=np.int64)
    shared = np.empty(len(clusters))
    for old, new in first_use.items():
        shared[new] = values[old]
    return shared, renumbered


def sinusoid_values(positions: np.ndarray, frequencies: np.ndarray, phases: np.ndarray) -> np.ndarray:
    """The formula in float64: [n] positions × [d] columns."""
    angles = np.asarray(positions, dtype=np.float64)[:, None] * frequencies[None, :]
    return np.where(phases[None, :] == SIN, np.sin(angles), np.cos(angles))


def standard_frequencies(width: int, base: float = 10000.0) -> np.ndarray:
    """w_i = base^(-2i/d) for each sin/cos pair, computed in float64."""
    return base ** (-np.arange(0, width, 2, dtype=np.float64) / width)


def sinusoid_table(length: int, width: int, base: float = 10000.0, layout: str = "interleaved") -> np.ndarray:
    """An exact table in float64: interleaved (sin, cos, …) or halves (sin… ‖ cos…)."""
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
    frequencies = _least_squares(table, phases, frequencies)
    positions = np.arange(table.shape[0])
    errors = np.abs(sinusoid_values(positions, frequencies, phases) - table).max(axis=0)
    if errors.max() > tolerance:
        return None
    if np.any(np.abs(frequencies) < 1e-9):
        return None  # a constant column (sin 0·p = 0, cos 0·p = 1) carries no position: not a sinusoid table
    shared, groups = group_columns(table, frequencies, phases, errors)
    shared = _snap_to_base(shared, table, phases, groups)
    frequencies = shared[groups]
    error = float(np.max(np.abs(sinusoid_values(positions, frequencies, phases) - table)))
    if error > tolerance:
        return None
    return SinusoidFit(frequencies, phases, error, _layout(phases, groups), groups, shared)


def _least_squares(table: np.ndarray, phases: np.ndarray, estimate: np.ndarray, steps: int = 3) -> np.ndarray:
    """Gauss-Newton on every row: low frequencies, whose cosine barely moves from 1, are
    pinned down by the whole column rather than by the one row the doubling walk could use."""
    positions = np.arange(table.shape[0], dtype=np.float64)[:, None]
    for _ in range(steps):
        angles = positions * estimate[None, :]
        model = np.where(phases == SIN, np.sin(angles), np.cos(angles))
        slope = np.where(phases == SIN, np.cos(angles), -np.sin(angles)) * positions
        denominator = (slope**2).sum(axis=0)
        step = np.where(denominator > 0, ((table - model) * slope).sum(axis=0) / np.maximum(denominator, 1e-300), 0.0)
        estimate = estimate + step
    return estimate


def _snap_to_base(shared: np.ndarray, table: np.ndarray, phases: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Where the shared frequencies are a base's b^(-2i/d), use the exact float64 values, if they fit no worse."""
    fit = SinusoidFit(shared[groups], phases, 0.0, "", groups, shared)
    base = fit.base
    if base is None:
        return shared
    positions = np.arange(table.shape[0])
    current = np.abs(sinusoid_values(positions, shared[groups], phases) - table).max()
    for candidate in (round(base), base):  # 10000.0002 is 10000
        exact = standard_frequencies(2 * len(shared), float(candidate))
        nearest = exact[np.argmin(np.abs(exact[None, :] - shared[:, None]), axis=1)]
        snapped = np.abs(sinusoid_values(positions, nearest[groups], phases) - table).max()
        if snapped <= max(current, 1e-7) * 1.01:
            return nearest
    return shared


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
    updated = np.zeros(len(phases), dtype=bool)
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
        usable = np.abs(value) < 0.9999
        estimate = np.where(usable, best / position, estimate)
        updated |= usable
    # A cosine that never left 0.9999 has its whole angle below 0.015 rad: read it off the last row,
    # so that the least-squares step starts with a slope to follow.
    slow = (phases == COS) & ~updated
    return np.where(slow, np.arccos(np.clip(table[last], -1.0, 1.0)) / last, estimate)


def _layout(phases: np.ndarray, groups: np.ndarray) -> str:
    d = len(phases)
    if d % 2 == 0:
        if np.all(phases[0::2] == SIN) and np.all(phases[1::2] == COS) and np.array_equal(groups[0::2], groups[1::2]):
            return "interleaved"
        half = d // 2
        if (
            np.all(phases[:half] == SIN)
            and np.all(phases[half:] == COS)
            and np.array_equal(groups[:half], groups[half:])
        ):
            return "halves"
    if np.all(phases == COS):
        return "cos-cache"
    if np.all(phases == SIN):
        return "sin-cache"
    return "mixed"
