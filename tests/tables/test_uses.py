"""What makes a constant a position table (pe_export/tables/uses.py), read from real TensorFlow graphs:
a fused kernel's prefix slice is a kernel, and position ids gated by the padding mask are still positions."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pe_export.api import export_tflite, find_position_tables
from pe_export.converters.options import ExportOptions
from pe_export.errors import ExitCode
from pe_export.graphdef import GraphIndex
from pe_export.tables.pipeline import TableOptions
from pe_export.tables.uses import KERNEL, LOOKUP, POSITION, uses_of
from tests.helpers import litert_outputs, max_abs_error, reference_outputs

WIDTH, ROWS, SEQ = 8, 24, 6


def _graph(body: Callable[[Any, Any, Any], Any], constant: np.ndarray) -> tuple[GraphIndex, str]:
    """The GraphDef of ``body(hidden, ids, mask)`` with ``constant`` in it as a Const node (not folded)."""
    import tensorflow as tf

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, SEQ, WIDTH], tf.float32),
            tf.TensorSpec([None, SEQ], tf.int32),
            tf.TensorSpec([None, SEQ], tf.int32),
        ]
    )
    def model(hidden: Any, ids: Any, mask: Any) -> Any:
        return body(hidden, ids, tf.constant(constant, name="the_constant"))

    graph_def = model.get_concrete_function().graph.as_graph_def()
    (name,) = [n.name for n in graph_def.node if n.op == "Const" and n.name.startswith("the_constant")]
    return GraphIndex(graph_def), name


def _roles(body: Callable[[Any, Any, Any], Any], constant: np.ndarray) -> set[str]:
    graph, name = _graph(body, constant)
    return {use.role for use in uses_of(graph, name, constant.shape[0])}


def _gated(style: str) -> Callable[[Any, Any, Any], Any]:
    def body(hidden: Any, ids: Any, table: Any) -> Any:
        import tensorflow as tf

        positions = tf.range(SEQ)[None, :]
        mask = tf.cast(ids > 0, tf.int32)
        gated = positions * mask if style == "multiply" else tf.where(mask > 0, positions, 0)
        return hidden + tf.gather(table, gated)

    return body


def test_a_fused_kernels_prefix_slice_is_a_kernel_not_a_table() -> None:
    import tensorflow as tf

    def fused_qkv(hidden: Any, ids: Any, kernel: Any) -> Any:
        # [d, 3d]: the query third starts at 0 on both axes and ends at a fixed column.
        q, k, v = (tf.matmul(hidden, kernel[:, i * WIDTH : (i + 1) * WIDTH]) for i in range(3))
        return tf.matmul(tf.nn.softmax(tf.matmul(q, k, transpose_b=True)), v)

    kernel = np.random.default_rng(0).normal(size=(WIDTH, 3 * WIDTH)).astype(np.float32)
    assert _roles(fused_qkv, kernel) == {KERNEL}


def test_a_fixed_prefix_of_a_table_added_along_the_sequence_is_a_table() -> None:
    def prefix(hidden: Any, ids: Any, table: Any) -> Any:
        return hidden + table[None, :SEQ]  # ROWS rows, SEQ kept: the add must see SEQ positions

    assert _roles(prefix, np.arange(ROWS * WIDTH, dtype=np.float32).reshape(ROWS, WIDTH)) == {POSITION}


@pytest.mark.parametrize("style", ["multiply", "where"])
def test_position_ids_gated_by_the_mask_are_positions(style: str) -> None:
    assert _roles(_gated(style), np.zeros((ROWS, WIDTH), np.float32)) == {POSITION}


def test_a_gather_by_token_ids_is_still_a_lookup() -> None:
    def lookup(hidden: Any, ids: Any, table: Any) -> Any:
        import tensorflow as tf

        return hidden + tf.gather(table, ids * 1 + 0)

    assert _roles(lookup, np.zeros((ROWS, WIDTH), np.float32)) == {LOOKUP}


@pytest.mark.parametrize("style", ["multiply", "where"])
@pytest.mark.parametrize("seq_len", [16, None])
def test_a_keras_encoder_with_gated_position_ids_exports_its_table(
    style: str, seq_len: int | None, variant_model, tmp_path: Path
) -> None:
    model = variant_model("gated_positions", seq_len, style=style)
    (found,) = find_position_tables(model, ExportOptions())
    assert (found.table.kind, found.table.name) == ("learned", "position_embedding/embeddings")
    if seq_len is not None:
        return  # the export path for a gathered learned table is the same at both lengths
    report = export_tflite(model, tmp_path / "m.tflite", ExportOptions(tables=TableOptions(method="none")))
    assert report.exit_code == ExitCode.OK and [t.table.name for t in report.tables] == [
        "position_embedding/embeddings"
    ]
    rng = np.random.default_rng(5)
    feed = {"token_ids": rng.integers(1, 64, (2, 12)).astype(np.int32), "attention_mask": np.ones((2, 12), np.int32)}
    feed["attention_mask"][1, 7:] = 0  # padding gates its position ids to row 0
    # Judged apart from the export's own check: the file in LiteRT against the SavedModel in TensorFlow.
    assert max_abs_error(litert_outputs(tmp_path / "m.tflite", feed), reference_outputs(model, feed)) <= 1e-5
