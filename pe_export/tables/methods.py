"""Compression methods for position tables, registered by name.

Each method turns a [L, d] table (float64) into a few stored arrays plus a recipe to rebuild
any rows from run-time positions: in numpy (to measure the table's own error) and as TF
ops (spliced into the graph, builtin ops only). ``budget`` is K, the most values stored per
position: L·K values in all.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from pe_export.registry import Registry
from pe_export.tables.sinusoid import COS, SinusoidFit


@dataclass
class Compressed:
    """What a method stores, and how to rebuild rows from it."""

    method: str
    exact: bool
    arrays: dict[str, np.ndarray]  # stored values (float) and small index maps (int32)
    rebuild: Callable[[np.ndarray, dict[str, np.ndarray]], np.ndarray]  # numpy: positions → rows
    emit: Callable[[Any, Any, Any], Any]  # tf, positions tensor, Store (see tables/graph.py) → rows
    notes: dict[str, Any] = field(default_factory=dict)

    def stored_values(self) -> int:
        return sum(a.size for a in self.arrays.values() if np.issubdtype(a.dtype, np.floating))

    def stored_bytes(self, itemsize: int) -> int:
        return sum(
            a.size * (itemsize if np.issubdtype(a.dtype, np.floating) else a.itemsize) for a in self.arrays.values()
        )


class Method(ABC):
    name: ClassVar[str]
    exact: ClassVar[bool]

    @classmethod
    @abstractmethod
    def plan(cls, table: np.ndarray, fit: SinusoidFit | None, budget: int | None) -> Compressed | None:
        """The compressed form within the budget, or None when the method cannot serve this table."""


# "auto" is resolved by the pipeline, which picks among these.
METHODS: Registry[type[Method]] = Registry("compression method", listed_first=("auto",))
register_method = METHODS.register


def method_names() -> list[str]:
    return METHODS.names()


def get_method(name: str) -> type[Method]:
    return METHODS.get(name)


@register_method("none")
class Frozen(Method):
    """The table as a constant, rows gathered at run time (used for float16 storage and --max-len)."""

    exact = True

    @classmethod
    def plan(cls, table: np.ndarray, fit: SinusoidFit | None, budget: int | None) -> Compressed | None:
        return Compressed(
            cls.name,
            True,
            {"table": table},
            rebuild=lambda p, a: a["table"][p],
            emit=lambda tf, p, store: store.take("table", p),
        )


@register_method("angle")
class AngleAddition(Method):
    """Exact for sinusoids: p = qB + r and sin(a+b) = sin a cos b + cos a sin b.

    Stores sin/cos of qB·w for the L/B block starts and of r·w for the B offsets, once per
    distinct frequency: 2u(⌈L/B⌉ + B) values with B = ⌈√L⌉, so it grows as √L.
    """

    exact = True

    @classmethod
    def plan(cls, table: np.ndarray, fit: SinusoidFit | None, budget: int | None) -> Compressed | None:
        if fit is None:
            return None
        length = table.shape[0]
        block = max(1, math.ceil(math.sqrt(length)))
        blocks = math.ceil(length / block)
        frequencies, groups = fit.unique
        unique = len(frequencies)
        starts = np.arange(blocks, dtype=np.float64)[:, None] * block * frequencies[None, :]
        offsets = np.arange(block, dtype=np.float64)[:, None] * frequencies[None, :]
        arrays = {
            "start_sin": np.sin(starts),
            "start_cos": np.cos(starts),
            "offset_sin": np.sin(offsets),
            "offset_cos": np.cos(offsets),
            # Column c takes the sine (index g) or the cosine (index u + g) of its frequency g.
            "columns": (groups + np.where(fit.phases == COS, unique, 0)).astype(np.int32),
            "block": np.array(block, dtype=np.int32),
        }
        columns = arrays["columns"]
        if _standard_columns(columns):
            del arrays["columns"]  # the layout is rebuilt by concat or stack: no index map to store
        compressed = Compressed(
            cls.name,
            True,
            arrays,
            rebuild=lambda p, a: _angle_rebuild(p, a, columns),
            emit=lambda tf, p, c: _angle_emit(tf, p, c, columns),
            notes={"block": block, "frequencies": unique},
        )
        if budget is not None and compressed.stored_values() > budget * length:
            return None
        return compressed


def _standard_columns(columns: np.ndarray) -> bool:
    unique = len(columns) // 2
    halves = np.array_equal(columns, np.arange(len(columns)))
    interleaved = len(columns) % 2 == 0 and np.array_equal(
        columns, np.stack([np.arange(unique), unique + np.arange(unique)], 1).ravel()
    )
    return halves or interleaved


def _angle_rebuild(positions: np.ndarray, a: dict[str, np.ndarray], columns: np.ndarray) -> np.ndarray:
    block = int(a["block"])
    q, r = positions // block, positions % block
    sin_q, cos_q, sin_r, cos_r = a["start_sin"][q], a["start_cos"][q], a["offset_sin"][r], a["offset_cos"][r]
    both = np.concatenate([sin_q * cos_r + cos_q * sin_r, cos_q * cos_r - sin_q * sin_r], axis=-1)
    return both[:, columns]


def _angle_emit(tf: Any, positions: Any, store: Any, columns: np.ndarray) -> Any:
    """row(p) = A1[q]·B1[r] + A2[q]·B2[r], every factor already laid out per column.

    The per-column factors are expanded at run time from the per-frequency arrays, which are
    small (⌈L/B⌉ and B rows): sine columns take A1 = sin(qBw), A2 = cos(qBw); cosine columns
    A1 = cos(qBw), A2 = -sin(qBw); B1 = cos(rw), B2 = sin(rw). The big [n, d] work is then four
    gathers, two products and a sum, with no interleaving of full-size tensors.
    """
    width = len(columns)
    sin_q, cos_q = store.whole("start_sin"), store.whole("start_cos")
    sin_r, cos_r = store.whole("offset_sin"), store.whole("offset_cos")
    if np.array_equal(columns, np.arange(width)):  # halves: [sin ‖ cos]
        a1, a2 = tf.concat([sin_q, cos_q], 1), tf.concat([cos_q, -sin_q], 1)
        b1, b2 = tf.concat([cos_r, cos_r], 1), tf.concat([sin_r, sin_r], 1)
    elif _standard_columns(columns):  # interleaved: sin, cos, sin, cos, …

        def interleave(first: Any, second: Any) -> Any:
            return tf.reshape(tf.stack([first, second], axis=-1), [-1, width])

        a1, a2 = interleave(sin_q, cos_q), interleave(cos_q, -sin_q)
        b1, b2 = interleave(cos_r, cos_r), interleave(sin_r, sin_r)
    else:
        index = store.index("columns")
        a1 = tf.gather(tf.concat([sin_q, cos_q], 1), index, axis=1)
        a2 = tf.gather(tf.concat([cos_q, -sin_q], 1), index, axis=1)
        frequency = tf.math.floormod(index, sin_r.shape[-1])
        b1, b2 = tf.gather(cos_r, frequency, axis=1), tf.gather(sin_r, frequency, axis=1)
    q = tf.math.floordiv(positions, store.index("block"))
    r = tf.math.floormod(positions, store.index("block"))
    return tf.gather(a1, q) * tf.gather(b1, r) + tf.gather(a2, q) * tf.gather(b2, r)


@register_method("svd")
class TruncatedSVD(Method):
    """Lossy: table ≈ (U_r Σ_r) V_rᵀ with the largest rank r whose r(L + d) values fit the budget."""

    exact = False

    @classmethod
    def plan(cls, table: np.ndarray, fit: SinusoidFit | None, budget: int | None) -> Compressed | None:
        length, width = table.shape
        rank = min(length, width) if budget is None else min(length, width, budget * length // (length + width))
        if rank < 1:
            return None
        u, s, vt = np.linalg.svd(table, full_matrices=False)
        energy = float((s[:rank] ** 2).sum() / max((s**2).sum(), 1e-300))
        numerical_rank = int((s > s[0] * 1e-7).sum()) if s.size else 0
        arrays = {"left": u[:, :rank] * s[:rank], "right": vt[:rank]}
        return Compressed(
            cls.name,
            rank >= numerical_rank,
            arrays,
            rebuild=lambda p, a: a["left"][p] @ a["right"],
            emit=lambda tf, p, store: tf.matmul(store.take("left", p), store.whole("right")),
            notes={"rank": rank, "energy_kept": energy, "numerical_rank": numerical_rank},
        )


@register_method("interp")
class SeedInterpolation(Method):
    """The source write-up's recipe, lossy: keep K of the d dimensions (every (d/K)-th) and
    rebuild the others by linear interpolation between the nearest kept dimensions.

    The write-up's own code indexes its 64-column array with j = (i // 8) * 8 (so it reads
    past column 63 for every i ≥ 64) and swaps the two weights; this implements what it
    describes: stride-8 sampling, PE_i = (1-α)·PE_j + α·PE_k, α = (i - j) / (k - j).
    """

    exact = False

    @classmethod
    def plan(cls, table: np.ndarray, fit: SinusoidFit | None, budget: int | None) -> Compressed | None:
        width = table.shape[1]
        kept = min(width, budget or width)
        stride = width / kept
        kept_columns = np.minimum(np.round(np.arange(kept) * stride).astype(np.int64), width - 1)
        dims = np.arange(width)
        low = np.clip(np.searchsorted(kept_columns, dims, side="right") - 1, 0, kept - 1)
        high = np.minimum(low + 1, kept - 1)
        span = np.maximum(kept_columns[high] - kept_columns[low], 1)
        alpha = np.where(high > low, (dims - kept_columns[low]) / span, 0.0)
        alpha = np.clip(alpha, 0.0, 1.0)
        arrays = {
            "kept": table[:, kept_columns],
            "low": low.astype(np.int32),
            "high": high.astype(np.int32),
            "alpha": alpha,
        }
        return Compressed(
            cls.name,
            kept == width,
            arrays,
            rebuild=_interp_rebuild,
            emit=_interp_emit,
            notes={"kept_dims": kept, "stride": stride},
        )


def _interp_rebuild(positions: np.ndarray, a: dict[str, np.ndarray]) -> np.ndarray:
    rows = a["kept"][positions]
    return rows[:, a["low"]] * (1.0 - a["alpha"]) + rows[:, a["high"]] * a["alpha"]


def _interp_emit(tf: Any, positions: Any, store: Any) -> Any:
    rows, alpha = store.take("kept", positions), store.whole("alpha")
    return (
        tf.gather(rows, store.index("low"), axis=1) * (1.0 - alpha)
        + tf.gather(rows, store.index("high"), axis=1) * alpha
    )
