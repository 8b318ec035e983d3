"""Position arithmetic frozen (pe_export/tables/arithmetic.py), on graphs built here: what is frozen is exact at
every length, what is not a function of distance is left alone, conditions on shapes fold to their branch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pe_export.graphdef import node_name
from pe_export.savedmodel import FrozenSignature, load_savedmodel, signature_input_specs
from pe_export.tables.arithmetic import assert_guards, has_position_arithmetic, rewrite_position_arithmetic

BUCKETS, MAX_DISTANCE = 16, 40


def _buckets(tf: Any, length: Any) -> Any:
    """MPNet's relative buckets: a true division of integers (float64) and its log, cast back to an index."""
    positions = tf.range(length)
    relative = positions[None, :] - positions[:, None]
    n = -relative
    half = BUCKETS // 2
    result = tf.cast(n < 0, tf.int32) * half
    n = tf.abs(n)
    exact = half // 2
    large = exact + tf.cast(
        tf.math.log(n / exact) / math.log(MAX_DISTANCE / exact) * (half - exact), tf.int32
    )  # int / int: float64
    large = tf.minimum(large, half - 1)
    return result + tf.where(n < exact, n, large)


def _save(tmp_path: Path, kind: str) -> Path:
    import tensorflow as tf

    table = tf.Variable(np.random.default_rng(0).standard_normal((BUCKETS, 4)).astype("float32"))

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="ids")])
        def serve(self, ids: Any) -> dict[str, Any]:
            length = tf.shape(ids)[1]
            x = tf.cast(ids, tf.float32)[:, :, None] * tf.ones([1, 1, 4])
            if kind == "buckets":
                bias = tf.gather(table, _buckets(tf, length))  # [T, T, 4]
            elif kind == "not_distance":  # i·j: a function of both positions, not of their distance
                positions = tf.cast(tf.range(length), tf.float64)
                product = tf.cast(tf.math.sqrt(positions[:, None] * positions[None, :] + 1.0), tf.int32)
                bias = tf.gather(table, tf.minimum(product, BUCKETS - 1))
            elif kind == "assertion":  # on the ids' values (Longformer's ids < vocabulary), then a cond on them
                # int32 data asserts unguarded; other dtypes in a cond (an AssertGuard), as Longformer's
                with tf.control_dependencies(
                    [tf.debugging.assert_less(tf.cast(ids, tf.int64), tf.constant(100, tf.int64))]
                ):
                    x = tf.identity(x)
                bias = tf.cond(
                    tf.reduce_any(ids > 3), lambda: tf.gather(table, ids % BUCKETS), lambda: tf.zeros([1, 1, 4])
                )
            else:  # a condition on shapes that is the same at every length
                same = tf.shape(ids)[1] >= 0
                bias = tf.cond(same, lambda: tf.gather(table, _buckets(tf, length)), lambda: tf.zeros([1, 1, 4]))
            return {"out": x + tf.reduce_sum(bias, axis=1)[None]}

    model = Model()
    model.table = table
    path = tmp_path / kind
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})
    return path


def _frozen(path: Path) -> tuple[Any, FrozenSignature]:
    """(the loaded SavedModel, which keeps its variables alive; its signature frozen)."""
    loaded = load_savedmodel(path)
    signature = loaded.signature(None)
    return loaded, FrozenSignature(signature, signature_input_specs(signature), min_stand_in_bytes=1 << 40)


def _run(graph_def: Any, inputs: dict[str, str], outputs: dict[str, str], length: int) -> np.ndarray:
    import tensorflow as tf

    from pe_export.graphdef import concrete_from_graph_def

    function, _ = concrete_from_graph_def(graph_def, inputs, outputs)
    ids = np.arange(length, dtype=np.int32)[None] % 7
    return function(tf.constant(ids))["out"].numpy()


@pytest.mark.parametrize("kind", ["buckets", "condition"])
@pytest.mark.parametrize("limit", [None, 48])
def test_float_buckets_become_a_table_by_distance_exact_at_every_length(
    tmp_path: Path, kind: str, limit: int | None
) -> None:
    _loaded, frozen = _frozen(_save(tmp_path, kind))
    graph_def, inputs, outputs = frozen.graph()
    assert has_position_arithmetic(graph_def, inputs)
    rewrite = rewrite_position_arithmetic(graph_def, inputs, [node_name(o) for o in outputs], frozen.weights, limit)
    assert len(rewrite.tables) == 1 and (rewrite.folded_conditions > 0) == (kind == "condition")  # Switch nodes
    ops = {node.op for node in rewrite.graph_def.node}
    assert not ops & {"Log", "RealDiv", "Switch", "Merge"}, ops & {"Log", "RealDiv", "Switch", "Merge"}
    double = [
        node.name
        for node in rewrite.graph_def.node
        if any(key in node.attr and node.attr[key].type == 2 for key in ("T", "SrcT", "DstT", "dtype"))
    ]
    assert not double, double  # no float64 left: nothing TFLite lacks a kernel for
    table = rewrite.tables[0]
    assert table.saturated == (limit is None)
    lengths = [1, 2, 9, 47, 48] + ([300, 2500] if limit is None else [])  # past the length it was measured at
    for length in lengths:
        expected = _run(graph_def, inputs, outputs, length)
        np.testing.assert_array_equal(_run(rewrite.graph_def, inputs, outputs, length), expected)


def test_what_is_not_a_function_of_distance_is_left_alone(tmp_path: Path) -> None:
    _loaded, frozen = _frozen(_save(tmp_path, "not_distance"))
    graph_def, inputs, outputs = frozen.graph()
    rewrite = rewrite_position_arithmetic(graph_def, inputs, [node_name(o) for o in outputs], frozen.weights, 32)
    assert not rewrite.changed


def test_an_assertion_folds_to_its_passing_branch_and_a_condition_on_data_stays(tmp_path: Path) -> None:
    """The converters drop Assert ops but keep a lowered assertion's Switch and Merge (the TFLite converter then
    refuses Longformer's nested ones): the assertion's switches are decided for the branch that passes, found by
    what its branches hold; the cond on the ids' values is left as it is, and the values are the same."""
    _loaded, frozen = _frozen(_save(tmp_path, "assertion"))
    graph_def, inputs, outputs = frozen.graph()
    guards = assert_guards(graph_def)
    switches = [node for node in graph_def.node if node.op == "Switch"]
    assert guards and all(guards.values()) and len(guards) < len(switches)
    assert has_position_arithmetic(graph_def, inputs)
    rewrite = rewrite_position_arithmetic(graph_def, inputs, [node_name(o) for o in outputs], frozen.weights, None)
    ops = [node.op for node in rewrite.graph_def.node]
    assert "Assert" not in ops and ops.count("Switch") == len(switches) - len(guards) and "Merge" in ops
    for length in (1, 3, 9):  # ids = arange % 7: no id > 3 below 5 tokens, the other branch from then on
        expected = _run(graph_def, inputs, outputs, length)
        np.testing.assert_array_equal(_run(rewrite.graph_def, inputs, outputs, length), expected)
