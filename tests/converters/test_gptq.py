"""GPTQ's rounding (pe_export/converters/onnx/gptq.py): the nearest rounding where activations are uncorrelated, a
smaller product error than it where they are correlated (on activations it did not see too), and in a QDQ file only
the int8 values change, with onnxruntime's product closer to the float one."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from pe_export.converters.onnx.gptq import LEVEL, gptq_round, hessians, matmul_gptq, weight_dequantizers
from pe_export.converters.onnx.quantize import _run
from pe_export.converters.onnx.static_int8 import qdq_model
from tests.helpers import matmul_model


def correlated(rng: np.random.Generator, rows: int, channels: int, mixing: np.ndarray) -> np.ndarray:
    """Activations whose channels move together (a shared low-rank part), as a layer's inputs do."""
    return (rng.normal(size=(rows, channels)) @ mixing + 0.3 * rng.normal(size=(rows, channels))).astype(np.float32)


def nearest(weight: np.ndarray, step: np.ndarray) -> np.ndarray:
    return np.clip(np.round(weight / step), -LEVEL, LEVEL)


def test_uncorrelated_activations_round_to_nearest() -> None:
    rng = np.random.default_rng(1)
    weight = rng.normal(size=(48, 16)).astype(np.float32)
    step = np.abs(weight).max(axis=0) / LEVEL
    np.testing.assert_array_equal(gptq_round(weight, step, np.eye(48) * 3.0), nearest(weight, step))


def test_correlated_activations_keep_the_product_closer_on_activations_it_did_not_see() -> None:
    rng = np.random.default_rng(2)
    channels = 64
    mixing = rng.normal(size=(channels, channels)) * (rng.random(channels) < 0.2)
    weight = rng.normal(size=(channels, 24)).astype(np.float32)
    step = np.abs(weight).max(axis=0) / LEVEL
    seen, unseen = correlated(rng, 400, channels, mixing), correlated(rng, 400, channels, mixing)
    values = gptq_round(weight, step, seen.T.astype(np.float64) @ seen)
    assert values.dtype == np.int8 and np.abs(values.astype(int)).max() <= LEVEL
    assert (values != nearest(weight, step)).any()

    def error(x: np.ndarray, q: np.ndarray) -> float:
        return float(np.linalg.norm(x @ weight - x @ (q * step)))

    assert error(seen, values) < 0.95 * error(seen, nearest(weight, step))
    assert error(unseen, values) < error(unseen, nearest(weight, step))


def test_hessians_sum_the_valid_rows_of_every_call() -> None:
    rng = np.random.default_rng(3)
    calls = [{"x": rng.normal(size=(2, 5, 4))}, {"x": rng.normal(size=(1, 3, 4))}]
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    found = hessians(iter(calls), ["x"], [mask, None])
    valid = np.concatenate([calls[0]["x"].reshape(-1, 4)[mask.reshape(-1)], calls[1]["x"].reshape(-1, 4)])
    np.testing.assert_allclose(found["x"], valid.T @ valid, rtol=1e-5, atol=1e-5)


def test_a_qdq_file_takes_gptq_values_at_its_own_steps_and_computes_closer() -> None:
    rng = np.random.default_rng(4)
    channels = 64
    mixing = rng.normal(size=(channels, channels)) * (rng.random(channels) < 0.2)
    weight = rng.normal(size=(channels, 24)).astype(np.float32)
    model = matmul_model(weight)
    calibration = [{"x": correlated(rng, 50, channels, mixing)} for _ in range(8)]
    unseen = [{"x": correlated(rng, 50, channels, mixing)} for _ in range(8)]
    plain = qdq_model(model, {"x": 1.0}, [], weight_only=["product"])
    rounded = qdq_model(
        model, {"x": 1.0}, [], weight_only=["product"], rounding=matmul_gptq(model, calibration, [None] * 8)
    )
    onnx.checker.check_model(rounded, full_check=True)
    ((stored, scale),) = weight_dequantizers(rounded).values()
    before = {i.name: i for i in plain.graph.initializer}
    after = {i.name: i for i in rounded.graph.initializer}
    assert after[stored].data_type == TensorProto.INT8
    np.testing.assert_array_equal(numpy_helper.to_array(after[scale]), numpy_helper.to_array(before[scale]))
    assert (numpy_helper.to_array(after[stored]) != numpy_helper.to_array(before[stored])).any()
    for name in set(before) - {stored}:
        assert after[name] == before[name], name

    def error(candidate: onnx.ModelProto) -> float:
        got = _run(candidate, unseen)
        return sum(float(np.linalg.norm(g["y"] - f["x"] @ weight)) for g, f in zip(got, unseen, strict=True))

    assert error(rounded) < error(plain)
