"""Block Hadamard rotation of an int8 product's input (QuaRot, Ashkboos et al. 2024; QuIP#'s incoherence): for
``y = x·W`` (W [inputs, outputs]) and an orthogonal H, ``y = (x·H)·(Hᵀ·W)``, the same arithmetic in float. H here
is block-diagonal, one normalized Sylvester Hadamard matrix of ``ROTATION_BLOCK`` channels per block, so a
channel's outlier is spread over its block: the row's int8 range shrinks (the hybrid kernel's per row, onnxruntime's
per tensor) and so do the weight's steps (Hᵀ·W's rows mix the block's rows). It costs a small float product of
the activation by H where smoothing's costs a MUL, so it is taken only where the simulation says it beats the
smoothing chosen for that input by ``ROTATION_GAIN``.

Measured on all-MiniLM-L6-v2 (48 varied sentences; simulated per-row int8 error of each FULLY_CONNECTED input,
relative): the feed-forward outputs' inputs (GELU outputs, 1,536 channels) 1.7-5x below the best smoothing with
blocks of 32 (blocks of 64 and 128 no better there), the attention and feed-forward inputs 1.2-1.4x, the attention
outputs' none. In the file, every weight int8: worst pooled cosine on the chosen sentences 0.99531 → 0.99798
(the token table with a step per row in both; ``benchmarks/real_weights.py``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from pe_export.converters.search.smoothing import (
    ALPHAS,
    Activations,
    QuantizedActivations,
    TensorChoice,
    migration_scale,
    per_channel_int8,
    sampled_columns,
)

ROTATION_BLOCK = 32  # channels per block: a power of two (Sylvester's construction)
ROTATION_GAIN = 1.5  # rotate an input only where it divides the smoothed input's simulated error at least by this


def hadamard(size: int) -> np.ndarray:
    """The normalized Sylvester Hadamard matrix of ``size`` (a power of two): orthogonal and symmetric."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"a Sylvester Hadamard matrix needs a power of two, not {size}")
    matrix = np.ones((1, 1), np.float64)
    while matrix.shape[0] < size:
        matrix = np.block([[matrix, matrix], [matrix, -matrix]])
    return (matrix / np.sqrt(size)).astype(np.float32)


def rotatable(channels: int, block: int = ROTATION_BLOCK) -> bool:
    """Whether ``channels`` split into whole blocks of ``block`` (one at least)."""
    return channels % block == 0 and channels >= block


def rotated_rows(rows: np.ndarray, block: int = ROTATION_BLOCK) -> np.ndarray:
    """``rows`` [..., channels]·H, block by block."""
    shape = rows.shape
    blocks = rows.reshape(-1, block).astype(np.float32) @ hadamard(block)
    return blocks.reshape(shape)


def rotated_weight(weight: np.ndarray, block: int = ROTATION_BLOCK) -> np.ndarray:
    """Hᵀ·``weight`` for a weight [inputs, outputs] (H is symmetric: each block's rows mixed by H)."""
    inputs, outputs = weight.shape
    blocks = weight.reshape(inputs // block, block, outputs).astype(np.float32)
    return np.einsum("ij,bjo->bio", hadamard(block), blocks).reshape(inputs, outputs)


def choose_rotations(
    groups: dict[str, tuple[Activations, np.ndarray]],
    choices: dict[str, TensorChoice],
    quantized: QuantizedActivations,
    block: int = ROTATION_BLOCK,
) -> dict[str, TensorChoice]:
    """The inputs (captured activations, joined weights [inputs, outputs]) to rotate, each with the smoothing α
    to rotate after (smoothing first moves an outlier's magnitude into the weights, the rotation spreads what is
    left) and its simulated int8 error (``best_scale``'s rows and columns): those where that beats the smoothing
    alone chosen for them (``choices``) by ``ROTATION_GAIN`` or more. The α tried are none, the smoothing's own
    and the next of the grid (where MiniLM's rotated inputs chose theirs): the full grid of eight took BERT-base's
    dynamic-int8 export 92 s where three take 84 s, and MiniLM's search at 0.999 kept one weight more float."""
    rotations = {}
    for tensor, (activations, weight) in groups.items():
        if not rotatable(weight.shape[0], block):
            continue
        columns = weight[:, sampled_columns(weight.shape[1])]
        exact = [rows @ columns for rows in activations.rows]
        best: TensorChoice | None = None
        for alpha in rotation_alphas(choices[tensor].alpha):
            scale = migration_scale(activations.channel_max, weight, alpha)
            rotated = per_channel_int8(rotated_weight(columns * scale[:, None], block))
            error = sum(
                float(np.square(quantized(rotated_rows(rows / scale, block)) @ rotated - product).sum())
                for rows, product in zip(activations.rows, exact, strict=True)
            )
            if best is None or error < best.best:
                best = replace(choices[tensor], best=error, alpha=alpha, scale=scale if alpha > 0.0 else None)
        if best is not None and best.best * ROTATION_GAIN <= choices[tensor].best:
            rotations[tensor] = best
    return rotations


def rotation_alphas(smoothing_alpha: float) -> tuple[float, ...]:
    """The smoothing α a rotation is simulated after: none, the input's smoothing's, and the next larger of
    ``ALPHAS``."""
    larger = [alpha for alpha in ALPHAS if alpha > smoothing_alpha]
    return tuple(sorted({0.0, smoothing_alpha, *larger[:1]}))
