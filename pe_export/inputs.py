"""Representative inputs for an encoder, generated from its input specs (numpy only).

Token ids stay inside the vocabulary read from the model's embedding, masks carry real
padding, segment ids stay inside their table, float features are standard normal.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from pe_export.specs import BATCH_AXIS, SEQUENCE_AXIS, TensorSpec, concrete_shape

MASK_WORDS = ("mask",)
# Upper bound used when the model does not reveal an integer input's range.
FALLBACK_INDEX_BOUND = 2


def is_mask_input(spec: TensorSpec, masks: Collection[str] | None = None) -> bool:
    """Whether ``spec`` is a padding mask: one of ``masks`` where the graph was read (input_roles.py), else (a
    file on the device side, no graph) by its name."""
    if masks is not None:
        return spec.name in masks
    return named_as_mask(spec.name)


def named_as_mask(name: str) -> bool:
    """The name's hint: an input named like a mask is taken for one where no graph says otherwise."""
    return any(word in name.lower() for word in MASK_WORDS)


def padded_lengths(batch: int, seq_len: int) -> np.ndarray:
    """Valid lengths per row: the first row is full, the rest are padded at several lengths."""
    if batch == 1:
        return np.array([seq_len])
    fractions = np.linspace(1.0, 0.25, batch)
    return np.maximum(1, np.round(fractions * seq_len)).astype(np.int64)


def valid_positions(batch: int, seq_len: int, *, padded: bool) -> np.ndarray:
    """[batch, seq_len] booleans: True where a position holds a real token, False where padding."""
    lengths = padded_lengths(batch, seq_len) if padded else np.full(batch, seq_len)
    return np.arange(seq_len)[None, :] < lengths[:, None]


def generate_inputs(
    specs: list[TensorSpec],
    index_bounds: dict[str, int],
    *,
    batch: int,
    seq_len: int,
    seed: int,
    padded: bool,
    masks: Collection[str] | None = None,
) -> dict[str, np.ndarray]:
    """One feed dict. With ``padded`` each row after the first ends in padding (id 0, mask 0). ``masks``: the
    padding masks as the graph says (None: by name)."""
    rng = np.random.default_rng(seed)
    feed: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = concrete_shape(spec, batch, seq_len)
        dtype = np.dtype(spec.dtype)
        if spec.is_integer or dtype == np.bool_:
            if is_mask_input(spec, masks):
                array = np.ones(shape, dtype=np.int64)
            else:
                high = max(1, index_bounds.get(spec.name, FALLBACK_INDEX_BOUND))
                # Id 0 is the padding id in most vocabularies: keep it for padding.
                low = 1 if high > 2 else 0
                array = rng.integers(low, high, size=shape, dtype=np.int64)
                if array.ndim == 3:
                    # per-token coordinates ([batch, tokens, k]) come in order: LayoutLM's boxes are
                    # (x0, y0, x1, y1) and index its width and height tables by x1 - x0 and y1 - y0
                    array = np.sort(array, axis=-1)
        else:
            array = rng.standard_normal(shape)  # type: ignore[assignment]  # int ids or float features
        if padded and spec.has_sequence:
            for row, length in enumerate(padded_lengths(shape[BATCH_AXIS], shape[SEQUENCE_AXIS])):
                array[row, length:] = 0
        feed[spec.name] = array.astype(dtype)
    return feed
