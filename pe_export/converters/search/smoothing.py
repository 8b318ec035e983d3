"""SmoothQuant's scales, shared by both formats: for ``Y = X·W`` (W constant, [inputs, outputs]),
``Y = (X / s)·(s·W)`` for any positive per-input-channel s, chosen as ``max|X_k|^α / max|W_k|^(1-α)``
with α per activation tensor from a grid, by the error of the runtime's own int8 product (the format
supplies how its kernels quantize activations; weights are int8 per output channel in both) on activations
captured from the float file. α 0 is no smoothing, so a tensor never gets worse in the simulation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

ALPHAS = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # 0: no smoothing
# Activation rows per tensor the α is chosen on: the simulation's cost grows with them (BERT-base, 2 cases of
# 4 rows of 512 positions: 49 tensors x 8 α on 4,096 rows each, and more in the ONNX single-row calls, took
# minutes). Rows beyond are thinned evenly (``thinned``).
SMOOTHING_ROWS = 1024
# Output channels the error is measured on: each is quantized on its own (one weight scale per output channel)
# and the activations' quantization does not depend on W, so evenly spaced columns give the error of all of
# them in proportion, exactly for the columns taken. BERT-base, every column: 1.4 TFLOP of simulation.
SMOOTHING_COLUMNS = 512
FLOOR = 1e-5  # a channel barely active keeps a finite scale
WEIGHT_LEVELS = 127  # int8 weights, symmetric, one scale per output channel (onnxruntime's and TFLite's)
OUTLIER_RATIO = 4.0  # a split channel's peak over the median channel's (pe_export/constants.py: OUTLIER_CHANNELS)
# A split is made where it divides the input's simulated int8 error at least by this. MiniLM's inputs by the
# gain measured: feed-forward inputs 1.7-3.1x and outputs 3.7-10x (all but the last layer's); the attention
# inputs 1.0-1.5x, each read by three MatMuls (nine side nodes for little).
OUTLIER_GAIN = 1.6
# activation rows [n, inputs] of one runtime call → as the runtime's int8 kernels see them (dequantized)
QuantizedActivations = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Smoothing:
    what: str  # the ops whose inputs were considered ("MatMul", "FULLY_CONNECTED")
    tensors: int  # activation tensors read by those ops
    smoothed: int  # of which smoothed (α > 0 was best)
    error_before: float  # simulated int8 error of all those products, relative (sum of squares)
    error_after: float
    outlier_tensors: int = 0  # inputs with channels split off into a float product (``onnx.outliers``)
    outlier_channels: int = 0
    outlier_bytes: int = 0  # the float rows those products read
    beside: tuple[str, ...] = ()  # the nodes of those products: never quantized
    rotated: int = 0  # inputs rotated by a block Hadamard instead (``search.hadamard``)
    rotation_block: int = 0  # its channels per block

    def note(self) -> str:
        split = (
            f"; {self.outlier_channels} outlier channels of {self.outlier_tensors} inputs computed in float "
            f"beside the int8 products, +{self.outlier_bytes:,} B"
            if self.outlier_channels
            else ""
        )
        rotated = (
            f", {self.rotated} rotated by a block Hadamard of {self.rotation_block} channels instead"
            if self.rotated
            else ""
        )
        return (
            f"activations smoothed into the weights before quantizing ({self.smoothed} of {self.tensors} "
            f"{self.what} inputs{rotated}{split}; simulated int8 error {self.error_before:.2e} → "
            f"{self.error_after:.2e})"
        )


@dataclass(frozen=True)
class Activations:
    """One tensor's captured activations: rows [n, inputs] per runtime call (thinned), and each input
    channel's largest magnitude over every row captured, thinned or not."""

    rows: list[np.ndarray]
    channel_max: np.ndarray


def thinned(calls: list[np.ndarray], limit: int = SMOOTHING_ROWS) -> Activations:
    """``calls`` (rows [n, inputs] per runtime call) cut to about ``limit`` rows in all (``thin_call``), the
    channel maxima taken before thinning (they set the migration scales)."""
    channel_max = np.max([np.abs(rows).max(axis=0) for rows in calls], axis=0)
    quota = call_quota(len(calls), limit)
    return Activations([thin_call(rows, quota) for rows in calls], channel_max)


def call_quota(calls: int, limit: int = SMOOTHING_ROWS) -> int:
    """Rows kept of each of ``calls`` runtime calls for about ``limit`` in all."""
    return -(-limit // max(calls, 1))


def thin_call(rows: np.ndarray, quota: int) -> np.ndarray:
    """One call's rows cut to about ``quota``, evenly spread; the rows that hold the call's largest and
    smallest value stay (they set a per-tensor range)."""
    if rows.shape[0] <= quota:
        return rows
    chosen = set(np.linspace(0, rows.shape[0] - 1, quota).astype(int).tolist())
    chosen.update(int(i) // rows.shape[1] for i in (rows.argmax(), rows.argmin()))
    return rows[sorted(chosen)]


@dataclass(frozen=True)
class TensorChoice:
    """One activation tensor's simulated int8 errors (sums of squares over its sampled products)."""

    plain: float  # α 0: no smoothing
    best: float  # the best α's
    energy: float  # the exact products'
    alpha: float
    scale: np.ndarray | None  # the best α's s


def best_scale(
    activations: Activations, weight: np.ndarray, quantized: QuantizedActivations, alphas: tuple[float, ...] = ALPHAS
) -> TensorChoice:
    """The α of ``alphas`` whose smoothing errs least in a simulation of the int8 products of one activation
    tensor (its captured activations) with the joined weights [inputs, outputs] of the ops that read it."""
    rows = activations.rows
    columns = weight[:, sampled_columns(weight.shape[1])]
    exact = [r @ columns for r in rows]
    plain, best_error, best_alpha, best = np.inf, np.inf, 0.0, None
    for alpha in alphas:
        scale = migration_scale(activations.channel_max, weight, alpha)  # from every column's maximum
        weight_int8 = per_channel_int8(columns * scale[:, None])
        error = sum(
            float(np.square(quantized(r / scale) @ weight_int8 - e).sum()) for r, e in zip(rows, exact, strict=True)
        )
        plain = error if alpha == 0.0 else plain
        if error < best_error:
            best_error, best_alpha, best = error, alpha, scale
    energy = sum(float(np.square(e).sum()) for e in exact)
    return TensorChoice(plain if np.isfinite(plain) else 0.0, best_error, energy, best_alpha, best)


def scales_of(choices: dict[str, TensorChoice], what: str) -> tuple[dict[str, np.ndarray], Smoothing]:
    """The scales of the tensors where α > 0 won, and the summary of ``choices``."""
    chosen = {t: c.scale for t, c in choices.items() if c.alpha > 0.0 and c.scale is not None}
    energy = sum(c.energy for c in choices.values())
    total = max(energy, 1e-30)
    before, after = sum(c.plain for c in choices.values()), sum(c.best for c in choices.values())
    return chosen, Smoothing(what, len(choices), len(chosen), before / total, after / total)


def outlier_channels(channel_max: np.ndarray, most: int, ratio: float = OUTLIER_RATIO) -> np.ndarray:
    """The input channels (ascending) to split off an int8 product: the ``most`` largest peaks that are at least
    ``ratio`` times the median channel's peak; none where the peaks are even."""
    if most <= 0 or channel_max.size <= most:
        return np.zeros(0, np.int64)
    median = float(np.median(channel_max))
    largest = np.argsort(-channel_max, kind="stable")[:most]
    return np.sort(largest[channel_max[largest] >= ratio * max(median, FLOOR)]).astype(np.int64)


def sampled_columns(count: int, limit: int = SMOOTHING_COLUMNS) -> np.ndarray:
    """Indices of at most ``limit`` of ``count`` output channels, evenly spaced (all of them when fewer)."""
    return np.unique(np.linspace(0, count - 1, min(count, limit)).astype(int))


def migration_scale(x_max: np.ndarray, weight: np.ndarray, alpha: float) -> np.ndarray:
    """s per input channel: ``max|X|^α / max|W|^(1-α)`` (ones for α 0, and where either maximum is 0)."""
    if alpha == 0.0:
        return np.ones(weight.shape[0], np.float32)
    w_max = np.abs(weight).max(axis=1)
    scale = np.maximum(x_max, FLOOR) ** alpha / np.maximum(w_max, FLOOR) ** (1.0 - alpha)
    # A channel never active in calibration (or a weight row of zeros) has nothing to migrate: a scale from the
    # floor would shrink its weight row below the int8 step, and the row would be lost where the channel wakes.
    return np.where((x_max > 0) & (w_max > 0), scale, 1.0).astype(np.float32)


def symmetric_int8(weight: np.ndarray, axis: int, levels: int = WEIGHT_LEVELS) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, steps) of symmetric quantization with one step per channel, the channels along the axes
    other than ``axis`` (the one reduced over): what both formats' int8 weights are. Steps keep their axis."""
    step = np.maximum(np.abs(weight).max(axis=axis, keepdims=True), 1e-12) / levels
    return np.clip(np.round(weight / step), -levels, levels).astype(np.int8), step


def per_channel_int8(weight: np.ndarray, levels: int = WEIGHT_LEVELS) -> np.ndarray:
    """``weight`` [inputs, outputs] after symmetric int8 with one scale per output channel, dequantized."""
    values, step = symmetric_int8(weight, 0, levels)
    return values * step


def range_quantized(x: np.ndarray, levels: int, axis: int | None) -> np.ndarray:
    """``x`` through asymmetric quantization over its range along ``axis`` (None: one range for the whole
    array), dequantized: how the runtimes' dynamic int8 kernels see activations. The range always holds 0,
    which stays exact; a range of one value takes step 1."""
    low = np.minimum(x.min(axis=axis, keepdims=True), 0.0)
    high = np.maximum(x.max(axis=axis, keepdims=True), 0.0)
    step = np.where(high > low, (high - low) / levels, 1.0)
    zero = np.round(-low / step)
    return (np.clip(np.round(x / step) + zero, 0, levels) - zero) * step
