"""Error statistics: exact numbers on hand-made arrays."""

from __future__ import annotations

import numpy as np
import pytest

from pe_export.errors import BadInputError
from pe_export.parity.metrics import compare_output
from pe_export.parity.tolerances import FP32_TOLERANCE, Tolerance, tolerance_for
from pe_export.specs import TensorSpec, sequence_outputs


def test_statistics_and_worst_index() -> None:
    expected = np.zeros((2, 3, 4), np.float32) + 1.0
    actual = expected.copy()
    actual[1, 2, 3] += 0.5
    metrics = compare_output("h", actual, expected, FP32_TOLERANCE)
    assert metrics.max_abs == pytest.approx(0.5)
    assert metrics.mean_abs == pytest.approx(0.5 / 24)
    assert metrics.max_rel == pytest.approx(0.5)
    assert metrics.worst_index == (1, 2, 3)
    assert not metrics.within_tolerance
    assert compare_output("h", expected, expected, FP32_TOLERANCE).within_tolerance


def test_nan_and_inf_fail_and_are_counted() -> None:
    expected = np.ones(5)
    actual = np.array([1.0, np.nan, np.inf, 1.0, 1.0])
    metrics = compare_output("h", actual, expected, Tolerance(1.0, 1.0, 0.0))
    assert (metrics.nan_count, metrics.inf_count, metrics.within_tolerance) == (1, 1, False)


def test_padded_positions_are_excluded() -> None:
    expected = np.zeros((2, 4, 3))
    actual = expected.copy()
    actual[1, 3] = 9.0  # garbage at a padded position
    valid = np.array([[True] * 4, [True, True, True, False]])
    assert compare_output("h", actual, expected, FP32_TOLERANCE, valid).within_tolerance
    assert not compare_output("h", actual, expected, FP32_TOLERANCE).within_tolerance


def test_a_hidden_axis_as_long_as_the_sequence_is_not_masked() -> None:
    """A [batch, hidden] output with hidden equal to the checked length (MiniLM's pooled output at 384) is
    masked by shape alone; the signature says it has no sequence axis, and then every unit counts."""
    expected = np.zeros((2, 4))
    actual = expected.copy()
    actual[1, 3] = 9.0  # a hidden unit where the mask says "padding"
    valid = np.array([[True] * 4, [True, True, True, False]])
    assert compare_output("pooled", actual, expected, FP32_TOLERANCE, valid).within_tolerance  # by shape: skipped
    assert not compare_output("pooled", actual, expected, FP32_TOLERANCE, valid, sequence=False).within_tolerance
    assert compare_output("tokens", actual, expected, FP32_TOLERANCE, valid, sequence=True).within_tolerance


def test_attention_scores_leave_out_padded_queries_and_keys() -> None:
    """A layer's attention scores [batch, heads, query, key] run along the sequence on their last two axes: an
    error where either the query or the key is padding (masked away by the softmax after) does not count; one at
    valid positions does, and the heads axis, as long as the sequence here, is never masked."""
    from pe_export.parity.layers.compare import LayerComparison

    expected = np.zeros((2, 4, 4, 4))
    valid = np.array([[True] * 4, [True, True, True, False]])

    def verdict(actual: np.ndarray) -> bool:
        comparison = LayerComparison({"scores": "t"}, FP32_TOLERANCE, {"scores": (2, 3)})
        comparison.update({"t": actual}, {"scores": expected}, valid)
        return comparison.result()[0].ok

    padded = expected.copy()
    padded[1, :, 0, 3] = padded[1, :, 3, 0] = 9.0  # a padded key, a padded query
    assert verdict(padded)
    inside = expected.copy()
    inside[1, 3, 2, 2] = 9.0  # a valid query and key, in the head whose index is the padded position's
    assert not verdict(inside)
    old_layout = LayerComparison({"scores": "t"}, FP32_TOLERANCE, {})  # no sequence axes: everything counts
    old_layout.update({"t": padded}, {"scores": expected}, valid)
    assert not old_layout.result()[0].ok


def test_golden_records_the_sequence_axes_of_each_layer() -> None:
    from pe_export.golden import _sequence_axes

    assert _sequence_axes((2, 12, 6, 6), 6) == [2, 3]  # scores, whatever the heads
    assert _sequence_axes((2, 6, 6, 6), 6) == [2, 3]  # heads as many as positions
    assert _sequence_axes((2, 6, 384), 6) == [1] and _sequence_axes((2, 6, 12, 32), 6) == [1]
    assert _sequence_axes((2, 384), 384) == [] and _sequence_axes((2, 6, 384), 384) == []


def test_sequence_outputs_come_from_the_signature() -> None:
    """Dynamic length: outputs whose axis 1 is dynamic too; fixed length 384: rank 3 with axis 1 of 384 only."""
    dynamic_in = [TensorSpec("ids", "int32", (None, None))]
    outputs = [
        TensorSpec("pooled", "float32", (None, 384)),
        TensorSpec("sequence", "float32", (None, None, 384)),
        TensorSpec("start_logits", "float32", (None, None)),
    ]
    assert sequence_outputs(dynamic_in, outputs) == {"sequence", "start_logits"}
    fixed_in = [TensorSpec("ids", "int32", (None, 384))]
    fixed_out = [spec.at_length(384) for spec in outputs]
    assert sequence_outputs(fixed_in, fixed_out) == {"sequence"}  # [batch, 384] is ambiguous: left unmasked


def test_cosine_gate() -> None:
    expected = np.array([1.0, 0.0])
    actual = np.array([0.0, 1.0])
    assert compare_output("h", actual, expected, Tolerance(10.0, 0.0, 0.5)).cosine == pytest.approx(0.0)
    assert not compare_output("h", actual, expected, Tolerance(10.0, 0.0, 0.5)).within_tolerance


def test_unknown_precision() -> None:
    with pytest.raises(BadInputError, match="expected one of: fp32, fp16, int8"):
        tolerance_for("bf16")


def test_pooled_cosine_is_the_worst_row_over_its_valid_positions() -> None:
    rng = np.random.default_rng(1)
    expected = rng.standard_normal((2, 4, 8))
    actual = expected.copy()
    actual[1, 0] += 0.5  # row 1, a valid position
    actual[0, 3] += 100.0  # row 0, a padded position: must not count
    valid = np.array([[True, True, True, False], [True, True, True, True]])
    metrics = compare_output("sequence_output", actual, expected, FP32_TOLERANCE, valid)
    pooled_a, pooled_e = actual[1].mean(axis=0), expected[1].mean(axis=0)
    want = pooled_a @ pooled_e / np.linalg.norm(pooled_a) / np.linalg.norm(pooled_e)
    assert metrics.pooled_cosine == pytest.approx(want, abs=1e-12) and want < 0.999


def test_one_rows_pooled_direction_fails_an_output_whose_flattened_cosine_passes() -> None:
    """A short sentence gone wrong hides in the batch's flattened cosine; its mean-pooled row does not."""
    rng = np.random.default_rng(2)
    expected = rng.standard_normal((2, 16, 8))
    actual = expected.copy()
    valid = np.zeros((2, 16), bool)
    valid[0], valid[1, :2] = True, True  # a 16-token sentence and a 2-token one
    actual[1, :2] += 0.6 * rng.standard_normal((2, 8))  # the short one moved
    loose = Tolerance(atol=10.0, rtol=0.0, min_cosine=0.95)
    metrics = compare_output("sequence_output", actual, expected, loose, valid)
    print(f"flattened cosine {metrics.cosine:.4f}, worst pooled row {metrics.pooled_cosine:.4f}")
    assert metrics.cosine >= 0.95 > metrics.pooled_cosine
    assert not metrics.within_tolerance and "worst row's mean-pooled cosine" in metrics.cosines()
    # The name decides nothing in the verdict: called logits (a class axis by name), the same output fails alike
    # and only reports its argmax agreement beside.
    named = compare_output("token_logits", actual, expected, loose, valid)
    assert (named.pooled_cosine, named.within_tolerance) == (metrics.pooled_cosine, False)
    assert named.argmax_agreement is not None and metrics.argmax_agreement is None
    actual[1, :2] = expected[1, :2]
    assert compare_output("sequence_output", actual, expected, loose, valid).within_tolerance
