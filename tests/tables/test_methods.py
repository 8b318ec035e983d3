"""Compression methods on the 512×512 table: the design notes' measured numbers, reproduced."""

from __future__ import annotations

import numpy as np
import pytest

from pe_export.errors import BadInputError
from pe_export.tables.methods import get_method, method_names
from pe_export.tables.sinusoid import fit_sinusoid, sinusoid_table

TABLE = sinusoid_table(512, 512)
FIT = fit_sinusoid(TABLE.astype(np.float32))
POSITIONS = np.arange(512)


def table_error(name: str, budget: int | None) -> tuple[float, object]:
    compressed = get_method(name).plan(TABLE, FIT, budget)
    assert compressed is not None
    return float(np.abs(compressed.rebuild(POSITIONS, compressed.arrays) - TABLE).max()), compressed


def test_angle_addition_is_exact_and_11x() -> None:
    error, compressed = table_error("angle", 64)
    assert error < 1e-12 and compressed.exact
    # 2·256·(23 + 23) float32 values = 94,208 B, plus the int32 block size; no column map for interleaved.
    assert compressed.stored_bytes(4) == 94_212
    assert compressed.notes == {"block": 23, "frequencies": 256}


def test_svd_rank_and_energy() -> None:
    error, compressed = table_error("svd", 64)  # rank 32 fits 512·64 values
    assert compressed.notes["rank"] == 32 and not compressed.exact
    assert 0.8 < compressed.notes["energy_kept"] < 0.85 and error > 1.0
    full = get_method("svd").plan(TABLE, None, 128 * (512 + 512) // 512)  # rank 128
    assert full.notes["rank"] == 128 and full.exact  # numerical rank ≈ 124-125
    assert np.abs(full.rebuild(POSITIONS, full.arrays) - TABLE).max() < 1e-6


def test_seed_interpolation_is_lossy_as_measured() -> None:
    error, compressed = table_error("interp", 64)
    assert compressed.notes["kept_dims"] == 64 and not compressed.exact
    assert 1.9 <= error <= 2.0  # the design notes: max abs 2.0 — adjacent columns have unrelated frequencies


def test_angle_needs_a_sinusoid_and_the_registry_names_the_choices() -> None:
    assert get_method("angle").plan(np.random.default_rng(0).normal(size=(64, 32)), None, 16) is None
    assert method_names() == ["none", "angle", "svd", "interp"]
    with pytest.raises(BadInputError, match="expected one of: auto, none, angle, svd, interp"):
        get_method("dct")
