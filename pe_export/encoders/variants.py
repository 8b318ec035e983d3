"""One small encoder per position-encoding variant (README, "Position tables"), as Keras 3 models.

Token embedding → the variant's position information → LayerNorm → Dense. Each builder
takes the sequence length (None for dynamic) and returns an uncompiled keras.Model whose
output dict has "sequence_output".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pe_export.tables.sinusoid import sinusoid_table

VOCAB, WIDTH, MAX_LEN, MAX_RELATIVE = 64, 32, 64, 8


def _keras() -> tuple[Any, Any, Any]:
    import keras
    import tensorflow as tf
    from keras import layers

    return keras, tf, layers


def _tf_layers() -> tuple[Any, Any]:
    _, tf, layers = _keras()
    return tf, layers


def _encoder(
    seq_len: int | None,
    position: Callable[[Any, Any], Any],
    extra_inputs: tuple[str, ...] = (),
    width: int = WIDTH,
    head: bool = True,
) -> Any:
    keras, _, layers = _keras()
    keras.utils.set_random_seed(0)
    token_ids = keras.Input((seq_len,), dtype="int32", name="token_ids")
    inputs = {"token_ids": token_ids}
    for name in extra_inputs:
        inputs[name] = keras.Input((seq_len,), dtype="int32", name=name)
    x = layers.Embedding(VOCAB, width, name="token_embedding")(token_ids)
    x = position(x, inputs)
    if head:
        x = layers.LayerNormalization(epsilon=1e-6)(x)
        x = layers.Dense(WIDTH, activation="gelu")(x)
    return keras.Model(list(inputs.values()), {"sequence_output": x})


def sinusoid_constant(
    seq_len: int | None, base: float = 10000.0, length: int = MAX_LEN, width: int = WIDTH, head: bool = True
) -> Any:
    """Interleaved sin/cos table held as a constant [L, d] (the classic layer).

    ``head=False`` outputs token embedding + positions directly, so a test can read the table back.
    """
    tf, layers = _tf_layers()

    class SinusoidConstant(layers.Layer):  # type: ignore[name-defined]  # Keras, loaded lazily
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.table = tf.constant(sinusoid_table(length, width, base).astype("float32"))

        def call(self, x: Any) -> Any:
            return x + self.table[None, : tf.shape(x)[1]]

    return _encoder(seq_len, lambda x, _: SinusoidConstant(name="position_encoding")(x), width=width, head=head)


def sinusoid_encoder(
    seq_len: int | None, length: int = 512, width: int = 512, depth: int = 2, heads: int = 8, ffn: int = 2048
) -> Any:
    """A deployment-sized encoder around a constant sinusoid table: ``depth`` blocks of
    multi-head attention and an exact-GELU feed-forward, post-LayerNorm (for benchmarks)."""
    tf, layers = _tf_layers()
    table = sinusoid_table(length, width).astype("float32")

    def body(x: Any, _: Any) -> Any:
        positions = tf.constant(table)
        x = layers.Lambda(lambda t: t + positions[None, : tf.shape(t)[1]], name="position_encoding")(x)
        for _ in range(depth):
            x = layers.LayerNormalization(epsilon=1e-6)(x + layers.MultiHeadAttention(heads, width // heads)(x, x))
            hidden = layers.Dense(width)(layers.Dense(ffn, activation="gelu")(x))
            x = layers.LayerNormalization(epsilon=1e-6)(x + hidden)
        return x

    return _encoder(seq_len, body, width=width, head=False)


def sinusoid_computed(seq_len: int | None) -> Any:
    """The seed's "dynamic" layer: concatenated [sin ‖ cos] halves computed in-graph from range."""
    tf, layers = _tf_layers()

    class SinusoidComputed(layers.Layer):  # type: ignore[name-defined]  # Keras, loaded lazily
        def call(self, x: Any) -> Any:
            positions = tf.cast(tf.range(tf.shape(x)[1]), tf.float32)[:, None]
            rates = tf.exp(tf.range(0, WIDTH, 2, dtype=tf.float32) * (-np.log(10000.0) / WIDTH))[None, :]
            angles = positions * rates
            return x + tf.concat([tf.sin(angles), tf.cos(angles)], axis=-1)[None]

    return _encoder(seq_len, lambda x, _: SinusoidComputed(name="dynamic_position_encoding")(x))


def learned(seq_len: int | None) -> Any:
    """BERT-style learned table: a variable named position_embedding/embeddings."""
    tf, layers = _tf_layers()

    class LearnedPositions(layers.Layer):  # type: ignore[name-defined]  # Keras, loaded lazily
        def build(self, input_shape: Any) -> None:
            self.embeddings = self.add_weight(name="embeddings", shape=(MAX_LEN, WIDTH), initializer="glorot_uniform")

        def call(self, x: Any) -> Any:
            return x + self.embeddings[None, : tf.shape(x)[1]]

    return _encoder(seq_len, lambda x, _: LearnedPositions(name="position_embedding")(x))


def hybrid(seq_len: int | None) -> Any:
    """Fixed sinusoid plus a learnable offset: pe + 0.1 * offset."""
    tf, layers = _tf_layers()

    class HybridPositions(layers.Layer):  # type: ignore[name-defined]  # Keras, loaded lazily
        def build(self, input_shape: Any) -> None:
            self.fixed = tf.constant(sinusoid_table(MAX_LEN, WIDTH).astype("float32"))
            self.offset = self.add_weight(name="offset", shape=(MAX_LEN, WIDTH), initializer="random_normal")

        def call(self, x: Any) -> Any:
            table = self.fixed + 0.1 * self.offset
            return x + table[None, : tf.shape(x)[1]]

    return _encoder(seq_len, lambda x, _: HybridPositions(name="hybrid_position_encoding")(x))


def hybrid_separate(seq_len: int | None) -> Any:
    """The source write-up's hybrid layer: inputs + fixed[:, :T] + learnable[:, :T], two slices added in turn.
    At a fixed length folding merges them into one constant, which must still read as a hybrid."""
    tf, layers = _tf_layers()

    class SeparateHybrid(layers.Layer):  # type: ignore[name-defined]  # Keras, loaded lazily
        def build(self, input_shape: Any) -> None:
            self.fixed = tf.constant(sinusoid_table(MAX_LEN, WIDTH)[None].astype("float32"))
            self.learnable = self.add_weight(
                name="learnable_pe", shape=(1, MAX_LEN, WIDTH), initializer="random_normal"
            )

        def call(self, x: Any) -> Any:
            length = tf.shape(x)[1]
            return x + self.fixed[:, :length, :] + self.learnable[:, :length, :]

    return _encoder(seq_len, lambda x, _: SeparateHybrid(name="positional_encoding")(x))


def masked(seq_len: int | None) -> Any:
    """Padding-masked encoding: the table is multiplied by the run-time attention mask."""
    tf, layers = _tf_layers()

    class MaskedPositions(layers.Layer):  # type: ignore[name-defined]  # Keras, loaded lazily
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.table = tf.constant(sinusoid_table(MAX_LEN, WIDTH).astype("float32"))

        def call(self, x: Any, mask: Any) -> Any:
            positions = self.table[None, : tf.shape(x)[1]]
            return x + positions * tf.expand_dims(tf.cast(mask, tf.float32), -1)  # [..., None] would be Flex

    return _encoder(
        seq_len,
        lambda x, inputs: MaskedPositions(name="masked_position_encoding")(x, inputs["attention_mask"]),
        extra_inputs=("attention_mask",),
    )


def relative(seq_len: int | None) -> Any:
    """Shaw et al.: a [2K+1, d] table gathered by the clipped distance matrix, used as attention bias."""
    tf, layers = _tf_layers()

    class RelativePositions(layers.Layer):  # type: ignore[name-defined]  # Keras, loaded lazily
        def build(self, input_shape: Any) -> None:
            self.embeddings = self.add_weight(
                name="relative_pos_emb", shape=(2 * MAX_RELATIVE + 1, WIDTH), initializer="glorot_uniform"
            )

        def call(self, x: Any) -> Any:
            length = tf.shape(x)[1]
            distance = tf.range(length)[:, None] - tf.range(length)[None, :]
            index = tf.clip_by_value(distance, -MAX_RELATIVE, MAX_RELATIVE) + MAX_RELATIVE
            relations = tf.gather(self.embeddings, index)  # [T, T, d]
            scores = tf.einsum("btd,tsd->bts", x, relations) / np.sqrt(WIDTH)
            return x + tf.matmul(tf.nn.softmax(scores, axis=-1), x)

    return _encoder(seq_len, lambda x, _: RelativePositions(name="relative_position")(x))


def t5_bias(seq_len: int | None) -> Any:
    """T5-style relative attention bias: a [buckets, heads] table gathered by bucketed distances (exact
    buckets near, log-spaced far, by sign) and added to the attention scores."""
    tf, layers = _tf_layers()
    buckets, heads, max_distance = 32, 4, 64

    class BucketBias(layers.Layer):  # type: ignore[name-defined]  # Keras, loaded lazily
        def build(self, input_shape: Any) -> None:
            self.bias = self.add_weight(
                name="relative_attention_bias", shape=(buckets, heads), initializer="glorot_uniform"
            )

        def call(self, x: Any) -> Any:
            length = tf.shape(x)[1]
            distance = tf.range(length)[None, :] - tf.range(length)[:, None]
            half, exact = buckets // 2, buckets // 4
            offset = tf.cast(distance > 0, tf.int32) * half
            magnitude = tf.abs(distance)
            far = exact + tf.cast(
                tf.math.log(tf.cast(tf.maximum(magnitude, 1), tf.float32) / exact)
                / np.log(max_distance / exact)
                * (half - exact),
                tf.int32,
            )
            bucket = offset + tf.where(magnitude < exact, magnitude, tf.minimum(far, half - 1))
            bias = tf.transpose(tf.gather(self.bias, bucket), [2, 0, 1])[None]  # [1, heads, T, T]
            q = tf.reshape(x, [-1, length, heads, WIDTH // heads])
            scores = tf.einsum("bqhd,bkhd->bhqk", q, q) / np.sqrt(WIDTH // heads) + bias
            mixed = tf.einsum("bhqk,bkhd->bqhd", tf.nn.softmax(scores, axis=-1), q)
            return x + tf.reshape(mixed, tf.shape(x))

    return _encoder(seq_len, lambda x, _: BucketBias(name="relative_attention")(x))


def rotary(seq_len: int | None) -> Any:
    """RoPE: cos/sin caches computed in-graph, applied by rotating feature pairs."""
    tf, layers = _tf_layers()

    class Rotary(layers.Layer):  # type: ignore[name-defined]  # Keras, loaded lazily
        def call(self, x: Any) -> Any:
            positions = tf.cast(tf.range(tf.shape(x)[1]), tf.float32)[:, None]
            rates = 1.0 / tf.pow(10000.0, tf.range(0, WIDTH, 2, dtype=tf.float32) / WIDTH)
            angles = positions * rates[None, :]
            cos = tf.concat([tf.cos(angles), tf.cos(angles)], axis=-1)[None]
            sin = tf.concat([tf.sin(angles), tf.sin(angles)], axis=-1)[None]
            first, second = x[..., : WIDTH // 2], x[..., WIDTH // 2 :]
            rotated = tf.concat([-second, first], axis=-1)
            return x * cos + rotated * sin

    return _encoder(seq_len, lambda x, _: Rotary(name="rotary_embedding")(x))


def gated_positions(seq_len: int | None, style: str = "multiply") -> Any:
    """A learned table gathered by position ids that the padding mask gates: ``range * mask`` (padding
    reads row 0) or ``where(mask, range, 0)``. The ids come from a range; the mask only gates them."""
    tf, layers = _tf_layers()

    class GatedPositions(layers.Layer):  # type: ignore[name-defined]  # Keras, loaded lazily
        def build(self, input_shape: Any) -> None:
            self.embeddings = self.add_weight(name="embeddings", shape=(MAX_LEN, WIDTH), initializer="glorot_uniform")

        def call(self, x: Any, mask: Any) -> Any:
            positions = tf.range(tf.shape(x)[1])[None, :]
            mask = tf.cast(mask, tf.int32)
            ids = positions * mask if style == "multiply" else tf.where(mask > 0, positions, 0)
            return x + tf.gather(self.embeddings, ids)

    return _encoder(
        seq_len,
        lambda x, inputs: GatedPositions(name="position_embedding")(x, inputs["attention_mask"]),
        extra_inputs=("attention_mask",),
    )


# name → (builder, the kinds `--list-tables` must report at a fixed length)
VARIANTS: dict[str, tuple[Callable[[int | None], Any], tuple[str, ...]]] = {
    "sinusoid_constant": (sinusoid_constant, ("sinusoid-interleaved",)),
    "sinusoid_base_5000": (lambda seq: sinusoid_constant(seq, base=5000.0), ("sinusoid-interleaved",)),
    "sinusoid_computed": (sinusoid_computed, ("sinusoid-halves",)),
    "learned": (learned, ("learned",)),
    "hybrid": (hybrid, ("hybrid",)),
    "hybrid_separate": (hybrid_separate, ("hybrid",)),
    "masked": (masked, ("sinusoid-interleaved",)),
    "relative": (relative, ("relative",)),
    "t5_bias": (t5_bias, ("relative",)),
    "rotary": (rotary, ("rotary-cos", "rotary-sin")),
}
