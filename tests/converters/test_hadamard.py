"""Block Hadamard rotation (``pe_export/converters/search/hadamard.py``): an identity in float, a smaller int8 range
for an outlier channel, chosen only where the simulation says it beats smoothing."""

from __future__ import annotations

import numpy as np
import pytest

from pe_export.converters.search.hadamard import (
    ROTATION_BLOCK,
    ROTATION_GAIN,
    choose_rotations,
    hadamard,
    rotatable,
    rotated_rows,
    rotated_weight,
)
from pe_export.converters.search.smoothing import Activations, best_scale, range_quantized


def _per_row(x: np.ndarray) -> np.ndarray:
    return range_quantized(x, 255, axis=-1)


@pytest.mark.parametrize("size", [1, 2, 4, 8, 32, 64])
def test_the_matrix_is_orthogonal_and_symmetric(size: int) -> None:
    matrix = hadamard(size).astype(np.float64)
    np.testing.assert_allclose(matrix @ matrix.T, np.eye(size), atol=1e-6)
    np.testing.assert_array_equal(matrix, matrix.T)
    assert np.all(np.isclose(np.abs(matrix), 1 / np.sqrt(size)))  # every entry ±1/√n: a channel spread evenly


@pytest.mark.parametrize("size", [0, 3, 48, 96])
def test_only_powers_of_two(size: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        hadamard(size)


def test_rotating_rows_and_weight_computes_the_same_product() -> None:
    rng = np.random.default_rng(3)
    rows, weight = rng.normal(size=(2, 7, 96)).astype(np.float32), rng.normal(size=(96, 40)).astype(np.float32)
    exact = rows.astype(np.float64) @ weight.astype(np.float64)
    rotated = rotated_rows(rows, ROTATION_BLOCK).astype(np.float64) @ rotated_weight(weight).astype(np.float64)
    np.testing.assert_allclose(rotated, exact, rtol=0, atol=1e-4 * np.abs(exact).max())
    assert rotatable(96) and rotatable(1536) and not rotatable(48) and not rotatable(16)


def test_an_outlier_channel_is_spread_over_its_block() -> None:
    row = np.zeros((1, 64), np.float32)
    row[0, 5] = 60.0
    spread = rotated_rows(row)
    np.testing.assert_allclose(np.abs(spread[0, :32]), 60.0 / np.sqrt(32), rtol=1e-6)
    assert not spread[0, 32:].any()  # the other block is untouched


def _groups(outliers: bool) -> dict[str, tuple[Activations, np.ndarray]]:
    rng = np.random.default_rng(9)
    rows = rng.normal(size=(256, 64)).astype(np.float32)
    if outliers:  # a few channels many times the rest on a few rows, as a trained encoder's GELU outputs
        rows[::16, 3] *= 80.0
        rows[::16, 41] *= 50.0
    weight = rng.normal(size=(64, 48)).astype(np.float32)
    return {"x": (Activations([rows], np.abs(rows).max(axis=0)), weight)}


@pytest.mark.parametrize("outliers", [True, False])
def test_rotation_is_chosen_where_it_beats_smoothing(outliers: bool) -> None:
    groups = _groups(outliers)
    choices = {name: best_scale(*group, _per_row) for name, group in groups.items()}
    rotations = choose_rotations(groups, choices, _per_row)
    rotated = rotations.get("x")
    print(f"outliers {outliers}: smoothed {choices['x'].best:.3e}, rotated {rotated and (rotated.best, rotated.alpha)}")
    if not outliers:  # even channels: nothing for a rotation to spread, its ops would buy nothing
        assert rotations == {}
        return
    assert rotated is not None and rotated.best * ROTATION_GAIN <= choices["x"].best
    # the figure is the simulation's own: computed apart (smoothed by its α's scale, then rotated), it agrees
    activations, weight = groups["x"]
    (rows,) = activations.rows
    scale = rotated.scale if rotated.scale is not None else np.ones(weight.shape[0], np.float32)
    moved = rotated_weight(weight * scale[:, None])
    steps = np.maximum(np.abs(moved).max(axis=0, keepdims=True), 1e-12) / 127
    product = _per_row(rotated_rows(rows / scale)) @ (np.clip(np.round(moved / steps), -127, 127) * steps)
    assert rotated.best == pytest.approx(float(np.square(product - rows @ weight).sum()), rel=1e-3)
