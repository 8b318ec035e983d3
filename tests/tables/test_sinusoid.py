"""Sinusoid recognition by value: layouts, bases, caches, precision (numbers against the formula)."""

from __future__ import annotations

import numpy as np
import pytest

from pe_export.tables.sinusoid import fit_sinusoid, sinusoid_table, standard_frequencies


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
@pytest.mark.parametrize("base", [10000.0, 5000.0, 20000.0, 777.7])
@pytest.mark.parametrize(("length", "width"), [(16, 32), (64, 32), (512, 512)])
def test_any_base_either_layout(layout: str, base: float, length: int, width: int) -> None:
    table = sinusoid_table(length, width, base, layout).astype(np.float32)
    fit = fit_sinusoid(table)
    assert fit is not None and fit.layout == layout
    assert fit.max_error <= 1e-7
    assert len(fit.unique[0]) == width // 2
    assert fit.base == pytest.approx(base, rel=1e-6)
    assert np.allclose(np.sort(fit.unique[0]), np.sort(standard_frequencies(width, base)), rtol=1e-9)


def test_rotary_caches_and_in_graph_float32_tables() -> None:
    angles = np.arange(128)[:, None] * standard_frequencies(64)[None, :]
    cos = np.concatenate([np.cos(angles)] * 2, axis=1).astype(np.float32)
    sin = np.concatenate([np.sin(angles)] * 2, axis=1).astype(np.float32)
    assert fit_sinusoid(cos).layout == "cos-cache" and fit_sinusoid(sin).layout == "sin-cache"
    # Computed in float32 the way a Keras layer does: a few ulps off the float64 formula, still found.
    positions = np.arange(512, dtype=np.float32)[:, None]
    rates = standard_frequencies(512).astype(np.float32)
    in_graph = np.concatenate([np.sin(positions * rates), np.cos(positions * rates)], axis=1)
    fit = fit_sinusoid(in_graph)
    assert fit is not None and fit.layout == "halves" and fit.max_error < 1e-4


def test_long_table_is_exact() -> None:
    fit = fit_sinusoid(sinusoid_table(8192, 256).astype(np.float32))
    assert fit is not None and fit.max_error <= 1e-7 and fit.base == pytest.approx(10000.0)


@pytest.mark.parametrize(
    "table",
    [
        np.random.default_rng(0).normal(size=(64, 32)),
        sinusoid_table(64, 32) + np.random.default_rng(1).normal(0, 1e-2, (64, 32)),
        np.zeros((64, 32)),
    ],
)
def test_not_a_sinusoid(table: np.ndarray) -> None:
    assert fit_sinusoid(table.astype(np.float32)) is None
