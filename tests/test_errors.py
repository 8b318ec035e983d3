"""The conventions errors.py names once: one line from any exception, one range check for every option."""

from __future__ import annotations

import pytest

from pe_export.bench import BenchOptions
from pe_export.constants import MAX_BATCH, MAX_SEQ_LEN
from pe_export.converters.options import ExportOptions
from pe_export.errors import BadInputError, check_range, one_line
from pe_export.golden import GoldenOptions
from pe_export.parity.result import ParityOptions
from pe_export.tables.pipeline import TableOptions


def test_one_line_takes_the_first_non_empty_line_or_the_type() -> None:
    assert one_line(ValueError("\n  \n  shapes differ: 3 vs 4  \ntraceback-ish detail")) == "shapes differ: 3 vs 4"
    assert one_line(RuntimeError()) == "RuntimeError"  # was an IndexError (exit 6) in four places
    assert one_line(OSError("   ")) == "OSError"


def test_one_line_of_a_tensorflow_graph_error_says_what_and_where() -> None:
    """TensorFlow's message starts "Graph execution error:" and its stack's header: the line that says what went
    wrong comes after them (LayoutLM's boxes refused were reported as "Graph execution error:" alone)."""
    import tensorflow as tf

    table = tf.constant([[1.0], [2.0]])
    lookup = tf.function(lambda ids: tf.gather(table, ids, name="rows"))
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        lookup(tf.constant([0, -6]))
    line = one_line(caught.value)
    assert line.startswith("indices[1] = -6 is not in [0, 2)") and "(at node rows" in line, line


def test_check_range_is_inclusive_and_ignores_absent_options() -> None:
    check_range("--batch", None, 1, 4)
    check_range("--batch", 1, 1, 4)
    check_range("--batch", 4, 1, 4)
    with pytest.raises(BadInputError, match=r"^--batch 5 is out of range; expected 1 to 4$"):
        check_range("--batch", 5, 1, 4)
    with pytest.raises(BadInputError, match=r"^--compress 0 is out of range; expected 1 to 65536 values per position$"):
        check_range("--compress", 0, 1, 1 << 16, " values per position")


@pytest.mark.parametrize(
    ("validate", "message"),
    [
        (lambda: ExportOptions(batch=MAX_BATCH + 1).validate("tflite"), f"--batch {MAX_BATCH + 1} is out of range"),
        (lambda: BenchOptions(batch=MAX_BATCH + 1).validate(), f"--batch {MAX_BATCH + 1} is out of range"),
        (lambda: GoldenOptions(batch=MAX_BATCH + 1).validate(), f"--batch {MAX_BATCH + 1} is out of range"),
        (lambda: ExportOptions(seq_len=MAX_SEQ_LEN + 1).validate("onnx"), "--seq-len 1048577 is out of range"),
        (lambda: BenchOptions(seq_len=MAX_SEQ_LEN + 1).validate(), "--seq-len 1048577 is out of range"),
        (lambda: GoldenOptions(seq_len=MAX_SEQ_LEN + 1).validate(), "--seq-len 1048577 is out of range"),
        (lambda: BenchOptions(threads=0).validate(), "--threads 0 is out of range; expected 1 to 1024"),
        (lambda: ParityOptions(threads=0).validate(), "--threads 0 is out of range; expected 1 to 1024"),
        (lambda: TableOptions(compress=0).validate(), "--compress 0 is out of range"),
        (lambda: ExportOptions(opset=12).validate("onnx"), "--opset 12 is out of range; expected 13 to 23"),
        (
            lambda: ExportOptions(quantize="dynamic-int8", outlier_channels=65).validate("onnx"),
            "--outlier-channels 65 is out of range; expected 0 to 64",
        ),
        (
            lambda: ExportOptions(quantize="dynamic-int8", outlier_channels=2).validate("tflite"),
            "--outlier-channels applies to ONNX --quantize dynamic-int8",
        ),
        (
            lambda: ExportOptions(quantize="float16", outlier_channels=0).validate("onnx"),
            "--outlier-channels applies to ONNX --quantize dynamic-int8 and int8 (the channels split off the int8 "
            "products), not --quantize float16 for onnx",
        ),
    ],
)
def test_every_command_bounds_an_option_the_same_way(validate, message: str) -> None:
    with pytest.raises(BadInputError) as raised:
        validate()
    assert str(raised.value).startswith(message)
