"""The trained task encoder: a task no model can solve without position information.

Task ("shift"): at every position p, output the token that stood SHIFT places earlier (0 for
the first SHIFT positions). Attention without positions is permutation-equivariant, so a
model whose position encoding is removed can only guess (chance ≈ 1/15); with the sinusoid
table it learns the task to 100% in seconds on a CPU. The architecture is the one the
source write-ups describe: token embedding, sinusoid positions masked by padding and added
before the first LayerNorm, N blocks of multi-head attention + exact-GELU feed-forward +
LayerNorm, dropout.

    python -m pe_export.encoders.task           # retrain deterministically, rewrite the weights file
    python -m pe_export.encoders.task --check   # retrain, print accuracy and digest, write nothing
    python -m pe_export.encoders.task --learned # the same with a learned position table
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import numpy as np

from pe_export.tables.sinusoid import sinusoid_table

VOCAB, SEQ_LEN, SHIFT, WIDTH, TABLE_LEN = 16, 16, 3, 32, 64
BLOCKS, HEADS, FFN, DROPOUT = 2, 2, 64, 0.1
TRAIN_SAMPLES, TEST_SAMPLES, EPOCHS, BATCH, LEARNING_RATE = 8000, 1000, 6, 64, 3e-3
TRAIN_SEED, TEST_SEED = 1, 2
WEIGHTS = Path(__file__).with_name("data") / "shift_task.weights.npz"
# The same encoder with a learned [TABLE_LEN, WIDTH] table instead of the sinusoid: only the rows the
# task reaches (0…SEQ_LEN-1) are trained, the rest keep their initial values, as in a real model.
LEARNED_WEIGHTS = Path(__file__).with_name("data") / "shift_task_learned.weights.npz"
TABLES = {"sinusoid": WEIGHTS, "learned": LEARNED_WEIGHTS}
LABEL_OUTPUT = "logits"


def task_data(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids 1…VOCAB-1 (0 is padding) and the shifted labels."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, (samples, SEQ_LEN)).astype(np.int32)
    labels = np.zeros_like(tokens)
    labels[:, SHIFT:] = tokens[:, :-SHIFT]
    return tokens, labels


def build_task_model(positions: bool = True, table_kind: str = "sinusoid") -> Any:
    import keras
    import tensorflow as tf
    from keras import layers

    keras.utils.set_random_seed(0)
    table = sinusoid_table(TABLE_LEN, WIDTH).astype("float32")

    class MaskedSinusoid(layers.Layer):
        """Adds the sinusoid table, zeroed at padding (token id 0)."""

        def call(self, embedded: Any, token_ids: Any) -> Any:
            rows = tf.constant(table)[None, : tf.shape(embedded)[1]]
            mask = tf.expand_dims(tf.cast(token_ids > 0, tf.float32), -1)
            return embedded + rows * mask

    class MaskedLearned(layers.Layer):
        """Adds a learned table (BERT-style), zeroed at padding (token id 0)."""

        def build(self, input_shape: Any) -> None:
            self.embeddings = self.add_weight(
                name="embeddings", shape=(TABLE_LEN, WIDTH), initializer=keras.initializers.RandomNormal(stddev=0.02)
            )

        def call(self, embedded: Any, token_ids: Any) -> Any:
            rows = self.embeddings[None, : tf.shape(embedded)[1]]
            mask = tf.expand_dims(tf.cast(token_ids > 0, tf.float32), -1)
            return embedded + rows * mask

    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = layers.Embedding(VOCAB, WIDTH, name="token_embedding")(token_ids)
    if positions and table_kind == "learned":
        x = MaskedLearned(name="position_embedding")(x, token_ids)
    elif positions:
        x = MaskedSinusoid(name="position_encoding")(x, token_ids)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    x = layers.Dropout(DROPOUT)(x)
    for _ in range(BLOCKS):
        attended = layers.MultiHeadAttention(HEADS, WIDTH // HEADS, dropout=DROPOUT)(x, x)
        x = layers.LayerNormalization(epsilon=1e-6)(x + attended)
        hidden = layers.Dense(WIDTH)(layers.Dense(FFN, activation="gelu")(x))
        x = layers.LayerNormalization(epsilon=1e-6)(x + layers.Dropout(DROPOUT)(hidden))
    logits = layers.Dense(VOCAB, name=LABEL_OUTPUT)(x)
    return keras.Model(token_ids, {LABEL_OUTPUT: logits})


def train(positions: bool = True, epochs: int = EPOCHS, table_kind: str = "sinusoid") -> Any:
    """Deterministic: fixed seeds, op determinism, one thread pool order."""
    import keras
    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()
    model = build_task_model(positions, table_kind)
    model.compile(
        optimizer=keras.optimizers.Adam(LEARNING_RATE),
        loss={LABEL_OUTPUT: keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
    )
    tokens, labels = task_data(TRAIN_SAMPLES, TRAIN_SEED)
    model.fit(tokens, {LABEL_OUTPUT: labels}, epochs=epochs, batch_size=BATCH, shuffle=True, verbose=0)
    return model


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Share of positions (from SHIFT on) where the arg-max token is the label."""
    return float((np.argmax(logits, axis=-1)[:, SHIFT:] == labels[:, SHIFT:]).mean())


def save_weights(model: Any, path: Path = WEIGHTS) -> str:
    arrays = {f"w{index:03d}": weight for index, weight in enumerate(model.get_weights())}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return weights_digest(model.get_weights())


def weights_digest(weights: list[np.ndarray]) -> str:
    digest = hashlib.sha256()
    for weight in weights:
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def load_trained_model(path: Path = WEIGHTS, table_kind: str = "sinusoid") -> Any:
    model = build_task_model(positions=True, table_kind=table_kind)
    with np.load(path, allow_pickle=False) as archive:
        model.set_weights([archive[key] for key in sorted(archive.files)])
    return model


if __name__ == "__main__":
    from pe_export.native import import_tensorflow

    import_tensorflow()
    kind = "learned" if "--learned" in sys.argv else "sinusoid"
    trained = train(table_kind=kind)
    tokens, labels = task_data(TEST_SAMPLES, TEST_SEED)
    score = accuracy(trained.predict(tokens, verbose=0)[LABEL_OUTPUT], labels)
    if "--check" in sys.argv:
        print(f"task accuracy {score:.4f}; weights sha256 {weights_digest(trained.get_weights())}")
    else:
        print(f"task accuracy {score:.4f}; weights sha256 {save_weights(trained, TABLES[kind])} → {TABLES[kind]}")
