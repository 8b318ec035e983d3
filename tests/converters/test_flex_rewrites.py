"""Exact rewrites of Flex ops into builtins (pe_export/converters/tflite/flex_rewrites.py): einsums that are one
batched matrix product, rolls by constant shifts, int64 Abs and Sign. Each graph at a dynamic shape, its values
checked against numpy's own einsum, roll, abs and sign, and a SavedModel holding all three exported with builtins
only and run in LiteRT."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pe_export.api import export_tflite
from pe_export.converters.options import ExportOptions
from pe_export.converters.tflite.flex_rewrites import einsums_as_matmul, int64_signs_by_comparison, rolls_as_gathers
from pe_export.errors import ExitCode

# (equation, operand shapes with None where dynamic, rewritten)
EINSUMS: list[tuple[str, tuple[list[int | None], list[int | None]], bool]] = [
    ("bcxd,bcyd->bcxy", ([2, None, 5, 4], [2, None, 6, 4]), True),  # Longformer's sliding chunks
    ("bcwd,bcdh->bcwh", ([2, None, 5, 4], [2, None, 4, 3]), True),
    ("blhd,bshd->blhs", ([2, None, 3, 4], [2, None, 3, 4]), True),  # its global keys: batch labels not leading
    ("blhs,bshd->blhd", ([2, None, 3, 5], [2, 5, 3, 4]), True),
    ("ij,jk->ki", ([None, 4], [4, 3]), True),  # no batch label, the output transposed
    ("bij,bjk->bik", ([None, 3, 4], [None, 4, 2]), True),
    # not one matrix product: left to the converter
    ("bij,bkj->bi", ([2, None, 4], [2, 3, 4]), False),  # two summed labels
    ("bii->bi", ([2, None, None],), False),
    ("...ij,...jk->...ik", ([2, None, 4], [2, 4, 3]), False),
]


def _frozen(function: Callable[..., Any], specs: list[Any]) -> tuple[Any, list[str], str]:
    import tensorflow as tf

    from pe_export.savedmodel import frozen_function

    frozen = frozen_function(tf.function(function).get_concrete_function(*specs))
    return frozen.graph.as_graph_def(), [t.name for t in frozen.inputs], frozen.outputs[0].name


def _run(graph_def: Any, feeds: list[str], fetch: str, values: list[np.ndarray]) -> np.ndarray:
    import tensorflow as tf

    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            return session.run(fetch, dict(zip(feeds, values, strict=True)))


@pytest.mark.parametrize(("equation", "shapes", "rewritten"), EINSUMS, ids=[e[0] for e in EINSUMS])
def test_an_einsum_of_one_matrix_product_becomes_batch_matmul(
    equation: str, shapes: tuple[list[int | None], ...], rewritten: bool
) -> None:
    import tensorflow as tf

    specs = [tf.TensorSpec(shape, tf.float32) for shape in shapes]
    graph_def, feeds, fetch = _frozen(lambda *xs: tf.einsum(equation, *xs), specs)
    after, count = einsums_as_matmul(graph_def)
    assert count == int(rewritten)
    ops = [node.op for node in after.node]
    assert ("Einsum" in ops) != rewritten and ("BatchMatMulV2" in ops) == rewritten
    rng = np.random.default_rng(0)
    sizes = iter([7, 7, 7, 7])  # every dynamic axis at the same length, as a shared label needs
    values = [rng.normal(size=[d or next(sizes) for d in shape]).astype(np.float32) for shape in shapes]
    expected = np.einsum(equation, *values)
    got = _run(after, feeds, fetch, values)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


ROLLS: list[tuple[list[int], list[int]]] = [([1, 3], [1, 2]), ([-2], [1]), ([9], [0]), ([0], [2])]


@pytest.mark.parametrize(("shift", "axis"), ROLLS, ids=[f"shift{s}-axis{a}" for s, a in ROLLS])
def test_a_roll_by_constant_shifts_becomes_gathers(shift: list[int], axis: list[int]) -> None:
    import tensorflow as tf

    graph_def, feeds, fetch = _frozen(
        lambda x: tf.roll(x, shift=shift, axis=axis), [tf.TensorSpec([None, None, 5], tf.float32)]
    )
    after, count = rolls_as_gathers(graph_def)
    assert count == 1 and "Roll" not in [node.op for node in after.node]
    for shape in ((2, 4, 5), (3, 11, 5), (1, 1, 5)):  # shifts past the length wrap, as numpy's do
        value = np.random.default_rng(1).normal(size=shape).astype(np.float32)
        assert np.array_equal(_run(after, feeds, fetch, [value]), np.roll(value, shift, axis))


@pytest.mark.parametrize("op", ["abs", "sign"])
def test_int64_abs_and_sign_by_comparison_for_every_value(op: str) -> None:
    import tensorflow as tf

    function = {"abs": tf.math.abs, "sign": tf.math.sign}[op]
    graph_def, feeds, fetch = _frozen(lambda x: function(x - 3), [tf.TensorSpec([None], tf.int64)])
    after, count = int64_signs_by_comparison(graph_def)
    assert count == 1 and {"Abs", "Sign"}.isdisjoint(node.op for node in after.node)
    big = np.iinfo(np.int64).max // 2
    value = np.array([-big, -(2**40), -5, 0, 3, 4, 2**33, big], np.int64)  # past int32 both ways
    reference = {"abs": np.abs, "sign": np.sign}[op](value - 3)
    assert np.array_equal(_run(after, feeds, fetch, [value]), reference)


def _flex_model(path: Path) -> Path:
    """A dynamic-length model with a roll, an int64 abs and an einsum: what a pip LiteRT could not run without the
    rewrites."""
    import tensorflow as tf

    class Model(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = tf.Variable(np.random.default_rng(2).normal(size=(8, 8)).astype(np.float32))

        @tf.function(
            input_signature=[tf.TensorSpec([None, None, 8], tf.float32), tf.TensorSpec([None, None], tf.int64)]
        )
        def serve(self, features: Any, mask: Any) -> dict[str, Any]:
            keys = tf.roll(tf.matmul(features, self.weight), shift=1, axis=1)
            heads = tf.shape(features)[:2]
            split = [tf.reshape(t, tf.concat([heads, [2, 4]], 0)) for t in (features, keys)]
            scores = tf.reduce_sum(tf.einsum("blhd,bshd->blhs", *split), axis=2)  # Longformer's global keys
            keep = tf.cast(tf.math.abs(1 - mask), tf.float32)[:, None, :]
            return {"scores": scores * keep}

    model = Model()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})
    return path


def test_a_model_with_roll_and_int64_abs_exports_builtins_only(tmp_path: Path) -> None:
    from pe_export.runners.litert import LiteRTRunner

    saved = _flex_model(tmp_path / "saved")
    output = tmp_path / "m.tflite"
    report = export_tflite(saved, output, ExportOptions(builtins_only=True))
    assert report.exit_code == ExitCode.OK and report.summary.flex_ops == [] and report.parity is not None
    joined = " ".join(report.notes)
    # (this einsum the converter lowers by itself, so it is left to it; Longformer's it does not: test_hf_models)
    assert "einsum(s)" not in joined and "roll(s) by constant shifts" in joined
    assert "int64 Abs/Sign op(s) computed by comparisons" in joined
    # independently of the export's verification: numpy's own einsum, roll and abs
    rng = np.random.default_rng(3)
    features = rng.normal(size=(2, 6, 8)).astype(np.float32)
    mask = np.array([[1] * 6, [1] * 4 + [0] * 2], np.int64)
    import tensorflow as tf

    weight = tf.saved_model.load(str(saved)).weight.numpy()
    keys = np.roll(features @ weight, 1, axis=1)
    split = [t.reshape(2, 6, 2, 4) for t in (features, keys)]
    expected = np.einsum("blhd,bshd->blhs", *split).sum(axis=2) * np.abs(1 - mask)[:, None, :].astype(np.float32)
    runner = LiteRTRunner(output)
    runner.activate()
    try:
        got = runner.infer({"features": features, "mask": mask})["scores"]
    finally:
        runner.deactivate()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
