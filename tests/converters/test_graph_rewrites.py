"""Axis-inserting StridedSlice → ExpandDims: same values in TensorFlow, builtin ops in TFLite."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pe_export.api import export_tflite
from pe_export.converters.graph_rewrites import new_axis_slices_to_expand_dims
from pe_export.converters.options import ExportOptions
from pe_export.errors import ExitCode

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
    assert report.notes == [
        "1 axis-inserting StridedSlice op(s) (x[:, None] and the like) converted as ExpandDims: "
        "without it they needed FlexStridedSlice"
    ]
    assert report.parity is not None and report.parity.passed and report.parity.max_abs < 1e-4
