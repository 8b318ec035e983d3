"""A TFLite dynamic-int8 table with a step per row (``tflite.table_int8``): each looked-up row comes back within half
its own step, where the converter's one step for the whole table loses the small rows; run in the installed TFLite
runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers import float_and_dynamic_range

ROWS, WIDTH = 2000, 32


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    """Rows whose peaks span two decades, as a trained token table's do (MiniLM: 0.075 to 1.05)."""
    rng = np.random.default_rng(21)
    values = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    return (values * (10.0 ** rng.uniform(-2.0, 0.0, size=(ROWS, 1)))).astype(np.float32)


@pytest.fixture(scope="module")
def table_files(table: np.ndarray) -> tuple[bytes, bytes]:
    """(float32 file, the converter's dynamic-range file) of rows = table[ids] (the table is over the converter's
    1,024-value minimum for quantizing it)."""
    from pe_export.native import import_tensorflow

    tf = import_tensorflow()
    constant = tf.constant(table)

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="ids")])
        def __call__(self, ids: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"rows": tf.gather(constant, ids)}

    return float_and_dynamic_range(Model())


def _lookups(data: bytes, ids: np.ndarray, tmp_path: Path) -> np.ndarray:
    from pe_export.converters.tflite.dynamic_int8 import run_candidates

    (outputs,) = run_candidates(data, [{"ids": ids}], tmp_path)
    return outputs["rows"]


def test_rows_come_back_within_half_their_own_step(
    table: np.ndarray, table_files: tuple[bytes, bytes], tmp_path: Path
) -> None:
    from pe_export.converters.tflite.dynamic_int8 import DynamicRangeFile

    float_file, quantized = table_files
    edited = DynamicRangeFile(quantized, float_file)
    assert [w.op_name for w in edited.weights.values()] == ["GATHER"]  # the table, matched by its values
    ids = np.arange(ROWS, dtype=np.int32).reshape(4, ROWS // 4)
    want = table[ids]
    row_step = np.abs(want).max(axis=-1, keepdims=True) / 127
    rowwise = _lookups(edited.build([]), ids, tmp_path)
    assert np.all(np.abs(rowwise - want) <= 0.5001 * row_step)
    converter = _lookups(quantized, ids, tmp_path)  # one step for the whole table: the small rows lose most
    relative = [
        float(np.median(np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1)))
        for got in (rowwise, converter)
    ]
    print(f"a row's relative error (median): a step per row {relative[0]:.2e}, the converter's {relative[1]:.2e}")
    assert relative[0] < 0.1 * relative[1]
    small = row_step[..., 0] < np.percentile(row_step, 10)  # rows of peak < ~0.016 against the table's ~4
    assert np.abs(converter - want)[small].max() > 4 * np.abs(rowwise - want)[small].max()
    grown = len(edited.build([])) - len(quantized)
    assert 4 * ROWS <= grown <= 4 * ROWS + 2048, grown  # a float32 step per row, and three ops


def test_a_table_kept_float_reads_its_rows_straight(
    table: np.ndarray, table_files: tuple[bytes, bytes], tmp_path: Path
) -> None:
    """Kept float, the GATHER reads the float16 table and writes where the row steps' MUL wrote: no DEQUANTIZE
    of the rows, no steps."""
    from ai_edge_litert.interpreter import Interpreter

    from pe_export.converters.tflite.dynamic_int8 import DynamicRangeFile

    float_file, quantized = table_files
    edited = DynamicRangeFile(quantized, float_file)
    data = edited.build(list(edited.weights))
    ids = np.array([[5, 1999, 0, 7]], np.int32)
    np.testing.assert_array_equal(_lookups(data, ids, tmp_path), table[ids].astype(np.float16).astype(np.float32))
    ops = [op["op_name"] for op in Interpreter(model_content=data)._get_ops_details()]
    assert ops.count("GATHER") == 1 and "MUL" not in ops[ops.index("GATHER") :], ops
    assert edited.build([]) != data and len(edited.build([])) < len(data)  # build left the objects as they were
