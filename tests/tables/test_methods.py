"""Compression methods on the 512×512 table: the design notes' measured numbers, reproduced."""

from __future__ import annotations

import math

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


def test_angle_addition_is_exact_and_grows_as_the_root_of_the_length() -> None:
    error, compressed = table_error("angle", 64)
    assert error < 1e-12 and compressed.exact
    # sin and cos of each distinct frequency at the block starts and the offsets: 2·u·(⌈L/B⌉ + B) float32 values,
    # plus the int32 block size (no column map for the interleaved layout); B minimises ⌈L/B⌉ + B.
    block, frequencies = compressed.notes["block"], compressed.notes["frequencies"]
    assert frequencies == len(np.unique(FIT.frequencies)) and frequencies <= 512 // 2
    assert block + math.ceil(512 / block) == min(b + math.ceil(512 / b) for b in range(1, 513))
    assert compressed.stored_bytes(4) == 2 * frequencies * (math.ceil(512 / block) + block) * 4 + 4
    assert compressed.stored_bytes(4) * 11 <= TABLE.size * 4 <= compressed.stored_bytes(4) * 12  # the notes' 11x


def test_svd_keeps_what_the_singular_values_say() -> None:
    error, compressed = table_error("svd", 64)
    rank = 64 * 512 // (512 + 512)  # the largest r with r·(L + d) values within 64 per position
    singular = np.linalg.svd(TABLE, compute_uv=False)
    assert compressed.notes["rank"] == rank and not compressed.exact
    # Eckart–Young: the energy kept and the Frobenius error of the best rank-r approximation, computed apart.
    assert compressed.notes["energy_kept"] == pytest.approx((singular[:rank] ** 2).sum() / (singular**2).sum())
    residual = compressed.rebuild(POSITIONS, compressed.arrays) - TABLE
    assert np.linalg.norm(residual) == pytest.approx(np.sqrt((singular[rank:] ** 2).sum()), rel=1e-9)
    assert error > 1e-4  # lossy beyond the fp32 tolerance: the report must say so
    numerical = int((singular > singular[0] * 1e-7).sum())
    full = get_method("svd").plan(TABLE, None, numerical * (512 + 512) // 512 + 2)
    assert full.notes["rank"] >= numerical and full.exact  # every singular value kept: exact
    assert np.abs(full.rebuild(POSITIONS, full.arrays) - TABLE).max() < 1e-6


def test_seed_interpolation_is_what_the_write_up_describes_and_lossy() -> None:
    error, compressed = table_error("interp", 64)
    assert compressed.notes["kept_dims"] == 64 and not compressed.exact
    # Independently: every 8th column kept, the others linearly interpolated between kept neighbours
    # (the last ones held at the last kept column), column by column with numpy.
    kept = np.arange(0, 512, 8)
    expected = np.stack([np.interp(np.arange(512), kept, row[kept]) for row in TABLE])
    rebuilt = compressed.rebuild(POSITIONS, compressed.arrays)
    assert np.abs(rebuilt - expected).max() < 1e-12
    # Adjacent columns of a sinusoid have unrelated frequencies: the loss is of the order of the values'
    # range ([-1, 1]), never beyond it.
    assert 1.0 < error <= 2.0


def test_angle_needs_a_sinusoid_and_the_registry_names_the_choices() -> None:
    assert get_method("angle").plan(np.random.default_rng(0).normal(size=(64, 32)), None, 16) is None
    assert method_names() == ["none", "angle", "svd", "interp"]
    with pytest.raises(BadInputError, match="expected one of: auto, none, angle, svd, interp"):
        get_method("dct")
