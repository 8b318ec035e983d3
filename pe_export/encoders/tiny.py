"""The tiny encoder the tests and benchmarks build: token embedding, sinusoid positions added before the first
LayerNorm, multi-head attention, an exact-GELU feed-forward block, LayerNorm.

Small on purpose: tests and the demo export it in seconds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

VOCAB = 64
WIDTH = 32
HEADS = 2
MAX_LEN = 64
FIXED_LEN = 16


def sinusoid_table(length: int, width: int, base: float = 10000.0) -> np.ndarray:
    """Interleaved sin/cos table, computed in float64 then cast."""
    positions = np.arange(length, dtype=np.float64)[:, None]
    rates = base ** (-np.arange(0, width, 2, dtype=np.float64) / width)
    table = np.zeros((length, width))
    table[:, 0::2] = np.sin(positions * rates)
    table[:, 1::2] = np.cos(positions * rates)
    return table.astype(np.float32)


def _layers() -> tuple[Any, Any, Any]:
    import keras
    import tensorflow as tf
    from keras import layers

    class AddPositions(layers.Layer):
        """Adds a frozen sinusoid table, sliced to the input's run-time length."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.table = tf.constant(sinusoid_table(MAX_LEN, WIDTH))

        def call(self, x: Any) -> Any:
            return x + self.table[None, : tf.shape(x)[1]]

    class CumulativeGate(layers.Layer):
        """x * cumprod(sigmoid(g)) along the sequence: Cumprod has no TFLite builtin (needs Flex)."""

        def build(self, input_shape: Any) -> None:
            self.gate = layers.Dense(input_shape[-1])
            self.gate.build(input_shape)

        def call(self, x: Any) -> Any:
            return x * tf.math.cumprod(tf.sigmoid(self.gate(x)), axis=1)

    return keras, layers, (AddPositions, CumulativeGate)


def build_encoder(
    seq_len: int | None = None, *, flex: bool = False, multi_io: bool = False, sliced_mask: bool = False
) -> Any:
    """Embedding + positions → MultiHeadAttention → LayerNorm → exact-GELU FFN → LayerNorm.

    ``sliced_mask`` writes the attention mask's new axis as ``mask[:, None, :]``, the spelling
    that needs FlexStridedSlice unless the exporter rewrites it (multi_io models only).
    """
    keras, layers, (add_positions, cumulative_gate) = _layers()
    keras.utils.set_random_seed(0)
    token_ids = keras.Input((seq_len,), dtype="int32", name="token_ids")
    inputs = [token_ids]
    x = layers.Embedding(VOCAB, WIDTH, name="token_embedding")(token_ids)
    mask = None
    if multi_io:
        attention_mask = keras.Input((seq_len,), dtype="int32", name="attention_mask")
        segment_ids = keras.Input((seq_len,), dtype="int32", name="segment_ids")
        inputs += [attention_mask, segment_ids]
        x = x + layers.Embedding(2, WIDTH, name="segment_embedding")(segment_ids)
        expanded = attention_mask[:, None, :] if sliced_mask else keras.ops.expand_dims(attention_mask, 1)
        mask = keras.ops.cast(expanded, "bool")
    x = add_positions(name="position_encoding")(x)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    attended = layers.MultiHeadAttention(HEADS, WIDTH // HEADS)(x, x, attention_mask=mask)
    x = layers.LayerNormalization(epsilon=1e-6)(x + attended)
    hidden = layers.Dense(2 * WIDTH, activation="gelu")(x)  # Keras 3 exact GELU → Erfc
    hidden = layers.Dense(WIDTH)(hidden)
    if flex:
        hidden = cumulative_gate(name="cumulative_gate")(hidden)
    x = layers.LayerNormalization(epsilon=1e-6)(x + hidden)
    outputs: dict[str, Any] = {"sequence_output": x}
    if multi_io:
        outputs["pooled_output"] = layers.Dense(WIDTH, activation="tanh", name="pooler")(x[:, 0])
    return keras.Model(inputs, outputs)
