"""StridedSlice rewrites for TFLite: axis-inserting ones → ExpandDims (builtin ops), prefix slices of a constant →
Slice (a fast kernel); the same values in TensorFlow either way."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pe_export.api import export_tflite
from pe_export.converters.options import ExportOptions
from pe_export.converters.tflite.graph_rewrites import new_axis_slices_to_expand_dims
from pe_export.errors import ExitCode
from pe_export.tables.pipeline import TableOptions

# (spelling, function of a [batch, time, width] tensor, slices it rewrites)
SLICES: list[tuple[str, Callable[[Any], Any], int]] = [
    ("x[:, None]", lambda x: x[:, None], 1),
    ("x[None]", lambda x: x[None], 1),
    ("x[..., None]", lambda x: x[..., None], 1),
    ("x[:, None, None, :]", lambda x: x[:, None, None, :], 1),
    ("x[..., None, :]", lambda x: x[..., None, :], 1),
    ("x[None, ..., None]", lambda x: x[None, ..., None], 1),
    ("x[0:, None]", lambda x: x[0:, None], 1),
    # Real slices stay StridedSlice: the converter handles them, or they are not ours to change.
    ("x[1:, None]", lambda x: x[1:, None], 0),
    ("x[:, 0, None]", lambda x: x[:, 0, None], 0),
    ("x[::2, None]", lambda x: x[::2, None], 0),
    ("x[:, :3]", lambda x: x[:, :3], 0),
]


def frozen_graph(function: Callable[[Any], Any]) -> tuple[Any, str, str]:
    import tensorflow as tf

    from pe_export.savedmodel import frozen_function

    concrete = tf.function(lambda x: function(x) * 1.0).get_concrete_function(
        tf.TensorSpec([None, None, 4], tf.float32)
    )
    frozen = frozen_function(concrete)
    return frozen.graph.as_graph_def(), frozen.inputs[0].name, frozen.outputs[0].name


def run_graph(graph_def: Any, feed_name: str, fetch_name: str, value: np.ndarray) -> np.ndarray:
    import tensorflow as tf

    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            return session.run(fetch_name, {feed_name: value})


@pytest.mark.parametrize(("spelling", "function", "expected"), SLICES, ids=[s[0] for s in SLICES])
def test_rewrite_keeps_the_values(spelling: str, function: Callable[[Any], Any], expected: int) -> None:
    graph_def, feed, fetch = frozen_graph(function)
    rewritten, count = new_axis_slices_to_expand_dims(graph_def)
    assert count == expected
    ops = [node.op for node in rewritten.node]
    assert ops.count("StridedSlice") == [node.op for node in graph_def.node].count("StridedSlice") - count
    assert ops.count("ExpandDims") == count * spelling.count("None")
    value = np.random.default_rng(0).normal(size=(3, 5, 4)).astype(np.float32)
    before, after = run_graph(graph_def, feed, fetch, value), run_graph(rewritten, feed, fetch, value)
    assert before.shape == after.shape and np.array_equal(before, after), spelling


@pytest.mark.parametrize("builtins_only", [False, True])
def test_sliced_attention_mask_exports_builtin_only(builtins_only: bool, saved_model, tmp_path: Path) -> None:
    report = export_tflite(
        saved_model("encoder_sliced_mask"), tmp_path / "m.tflite", ExportOptions(builtins_only=builtins_only)
    )
    assert report.exit_code == ExitCode.OK and report.summary.flex_ops == []
    assert report.notes == [  # its position table read as table[None, :T] is the second rewrite's
        "1 prefix slice(s) of a table (table[:, :T]) converted as SLICE: TFLite's STRIDED_SLICE kernel copies "
        "element by element (20x slower on a large table)",
        "1 axis-inserting StridedSlice op(s) (x[:, None] and the like) converted as ExpandDims: "
        "without it they needed FlexStridedSlice",
    ]
    assert report.parity is not None and report.parity.passed and report.parity.max_abs < 1e-4


def _table() -> Any:
    import tensorflow as tf

    return tf.constant(np.arange(64 * 4, dtype=np.float32).reshape(64, 4))


# (spelling, function of x [batch, time, 4] adding rows of a 64x4 constant table, slices it rewrites)
TABLE_SLICES: list[tuple[str, Callable[[Any], Any], int]] = [
    ("table[:T]", lambda x: x + _table()[: _length(x)], 1),
    ("table[None, :T]", lambda x: x + _table()[None, : _length(x)], 1),
    ("table[0:T, :]", lambda x: x + _table()[0 : _length(x), :], 1),
    ("table[:T][None]", lambda x: x + _table()[: _length(x)][None], 1),
    # Not a prefix of a constant, or an end that may be negative: StridedSlice's own semantics stay.
    ("table[1:T + 1]", lambda x: x + _table()[1 : _length(x) + 1], 0),
    ("table[:2 * T:2]", lambda x: x + _table()[: 2 * _length(x) : 2], 0),
    ("table[64 - T:]", lambda x: x + _table()[64 - _length(x) :], 0),
    ("x[:, :T]", lambda x: x[:, : _length(x)] * 2.0, 0),
]


def _length(x: Any) -> Any:
    import tensorflow as tf

    return tf.shape(x)[1]


@pytest.mark.parametrize(("spelling", "function", "expected"), TABLE_SLICES, ids=[s[0] for s in TABLE_SLICES])
def test_prefix_slice_of_a_constant_becomes_slice(spelling: str, function: Callable[[Any], Any], expected: int) -> None:
    from pe_export.converters.tflite.graph_rewrites import prefix_slices_to_slice

    graph_def, feed, fetch = frozen_graph(function)
    rewritten, count = prefix_slices_to_slice(graph_def)
    assert count == expected, spelling
    assert [node.op for node in rewritten.node].count("Slice") == count
    for length in (1, 5, 32):
        value = np.random.default_rng(length).normal(size=(3, length, 4)).astype(np.float32)
        before, after = run_graph(graph_def, feed, fetch, value), run_graph(rewritten, feed, fetch, value)
        assert before.shape == after.shape and np.array_equal(before, after), (spelling, length)


def test_a_dynamic_length_table_exports_as_slice(tmp_path: Path) -> None:
    from pe_export.encoders.variants import sinusoid_constant
    from pe_export.inspection import inspect_path
    from pe_export.native import import_tensorflow

    import_tensorflow()
    sinusoid_constant(None, length=512, width=64, head=False).export(str(tmp_path / "sm"), verbose=False)
    report = export_tflite(tmp_path / "sm", tmp_path / "m.tflite", ExportOptions())
    assert report.exit_code == ExitCode.OK and report.parity is not None and report.parity.passed
    assert report.parity.positions == 512 and report.parity.max_abs < 1e-5  # every row of the table checked
    assert any(note.startswith("1 prefix slice(s) of a table") for note in report.notes), report.notes
    ops = inspect_path(tmp_path / "m.tflite").op_counts
    assert ops["SLICE"] == 1 and ops["STRIDED_SLICE"] <= 1  # left: the length read from the input's shape
    # The table rebuilt at run time from --compress (only the rows the length reads): its slice too.
    small = export_tflite(tmp_path / "sm", tmp_path / "c.tflite", ExportOptions(tables=TableOptions(compress=16)))
    assert small.exit_code == ExitCode.OK and small.parity is not None and small.parity.passed
    assert small.tables[0].method == "angle" and small.parity.positions == 512
    assert any(note.startswith("1 prefix slice(s) of a table") for note in small.notes), small.notes
    assert inspect_path(tmp_path / "c.tflite").op_counts["SLICE"] == 1


# (spelling, function, slices it rewrites): an axis dropped by a constant index keeps it, then squeezes it
SHRINKING: list[tuple[str, Callable[[Any], Any], int]] = [
    ("x[:, 0]", lambda x: x[:, 0], 1),  # the pooler's first token
    ("x[:, -1]", lambda x: x[:, -1], 1),
    ("x[1, :, 2]", lambda x: x[1, :, 2], 1),
    ("x[:, 0, 1:3]", lambda x: x[:, 0, 1:3], 1),
    ("x[:, ::2, 0]", lambda x: x[:, ::2, 0], 1),
    ("x[..., 0]", lambda x: x[..., 0], 0),  # an ellipsis: left as it is
    ("x[:, 1:]", lambda x: x[:, 1:], 0),  # nothing dropped
]


@pytest.mark.parametrize(("spelling", "function", "expected"), SHRINKING, ids=[s[0] for s in SHRINKING])
def test_a_slice_that_drops_an_axis_keeps_it_and_squeezes(
    spelling: str, function: Callable[[Any], Any], expected: int
) -> None:
    from pe_export.converters.tflite.graph_rewrites import shrinking_slices_as_squeeze

    graph_def, feed, fetch = frozen_graph(function)
    rewritten, count = shrinking_slices_as_squeeze(graph_def)
    assert count == expected
    value = np.random.default_rng(0).normal(size=(3, 5, 4)).astype(np.float32)
    want = run_graph(graph_def, feed, fetch, value)
    got = run_graph(rewritten, feed, fetch, value)
    assert got.shape == want.shape and np.array_equal(got, want)
    if expected:
        masks = [n.attr["shrink_axis_mask"].i for n in rewritten.node if n.op == "StridedSlice"]
        assert masks and not any(masks) and any(n.op == "Squeeze" for n in rewritten.node)


def test_a_fixed_shape_export_has_no_slice_the_gpu_refuses(tmp_path: Path) -> None:
    """The trained demo encoder at batch 1 x 16: its slices that drop an axis were STRIDED_SLICEs with a shrink mask,
    which LiteRT's GPU accelerator refuses; exported at fixed shapes each keeps the axis, then a squeeze drops it.
    (Its embedding GATHER still falls back: docs/devices.md.) A dynamic export keeps the converter's own path."""
    from pe_export.encoders import task

    model = tmp_path / "encoder"
    task.load_trained_model().export(str(model), verbose=False)
    report = export_tflite(model, tmp_path / "fixed.tflite", ExportOptions(batch=1, seq_len=16))
    assert report.exit_code == ExitCode.OK and report.parity is not None and report.parity.passed
    assert any(re.match(r"[1-9]\d* slice\(s\) that drop an axis .* keep it and squeeze it", n) for n in report.notes)
    dynamic = export_tflite(model, tmp_path / "dynamic.tflite", ExportOptions())
    assert not any("squeeze" in note for note in dynamic.notes)


# (spelling, ids shape, lookup of a [7, 3] table, lookups it rewrites): ids of a fixed shape of rank 2 or more
LOOKUPS: list[tuple[str, list[int | None], Callable[[Any, Any], Any], int]] = [
    ("table[ids] of [2, 5]", [2, 5], lambda table, ids: _gather(table, ids), 1),
    ("table[ids] of [1, 6]", [1, 6], lambda table, ids: _gather(table, ids), 1),
    ("table[ids] of [2, 3, 4]", [2, 3, 4], lambda table, ids: _gather(table, ids), 1),
    ("two tables summed", [2, 5], lambda table, ids: _gather(table, ids) + _gather(_other_table(), ids % 2), 2),
    ("table[ids] of [5]", [5], lambda table, ids: _gather(table, ids), 0),  # already 1-D
    ("table[ids] of [None, 5]", [None, 5], lambda table, ids: _gather(table, ids), 0),  # shape not known
    ("columns: table[:, ids % 3]", [2, 2], lambda table, ids: _gather(table, ids % 3, axis=1), 0),
]


def _other_table() -> Any:
    import tensorflow as tf

    return tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))


def _gather(table: Any, ids: Any, axis: int = 0) -> Any:
    import tensorflow as tf

    return tf.gather(table, ids, axis=axis)


@pytest.mark.parametrize(("spelling", "shape", "function", "expected"), LOOKUPS, ids=[s[0] for s in LOOKUPS])
def test_a_lookup_by_a_matrix_of_ids_reads_flat_ids_as_rows_of_one_batch(
    spelling: str, shape: list[int | None], function: Callable[[Any, Any], Any], expected: int
) -> None:
    import tensorflow as tf

    from pe_export.converters.tflite.graph_rewrites import flat_lookups
    from pe_export.savedmodel import frozen_function

    table = tf.constant(np.random.default_rng(1).normal(size=(7, 3)).astype(np.float32))
    concrete = tf.function(lambda ids: function(table, ids) * 1.0).get_concrete_function(tf.TensorSpec(shape, tf.int32))
    frozen = frozen_function(concrete)
    graph_def, feed, fetch = frozen.graph.as_graph_def(), frozen.inputs[0].name, frozen.outputs[0].name
    rewritten, count = flat_lookups(graph_def)
    assert count == expected
    fixed = [d or 2 for d in shape]
    ids = (np.arange(np.prod(fixed)).reshape(fixed) * 5 % 7).astype(np.int32)
    want = run_graph(graph_def, feed, fetch, ids)
    got = run_graph(rewritten, feed, fetch, ids)
    assert got.shape == want.shape and np.array_equal(got, want)
    gathers = [node for node in rewritten.node if node.op == "GatherV2"]
    flat = [node for node in gathers if node.name.endswith("/flat")]
    assert len(flat) == expected
    index = {node.name: node for node in rewritten.node}
    for node in flat:  # 1-D ids, read along axis 1 of a [1, 7, 3] table: the rows come out [1, N, 3]
        assert index[node.input[1]].op == "Reshape" and index[node.input[0]].op == "ExpandDims"
        assert tf.make_ndarray(index[node.input[2]].attr["value"].tensor) == 1
