"""Static int8 in QDQ form: the graph's arithmetic against an independent numpy computation of the same
quantization, the ranges against the activations they come from, the method chosen by data it did not
calibrate on, and the search keeping float what the target needs, all in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pe_export.converters.onnx.gptq import weight_dequantizers
from pe_export.converters.onnx.quantize import _run
from pe_export.converters.onnx.static_int8 import (
    calibrate,
    matmul_activations,
    plan_static_int8,
    qdq_counts,
    qdq_model,
    sample_rows,
    static_candidates,
    static_int8_to_target,
)
from pe_export.converters.search.keep_float import ChoiceSamples
from pe_export.parity.tolerances import STATIC_INT8_CHOICE_SHARE, Tolerance
from tests.helpers import matmul_model, onnx_model, outlier_feeds


def attention_like() -> onnx.ModelProto:
    """y = x·W1, a = softmax(y·yᵀ/√24) (products of two activations, as attention's), u = relu(a·y)·W2."""
    rng = np.random.default_rng(11)
    inits = [
        numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)
        for name, shape in (("W1", (32, 24)), ("W2", (24, 16)))
    ] + [numpy_helper.from_array(np.float32(24**-0.5), "scale")]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["y"], name="project"),
        helper.make_node("Transpose", ["y"], ["yt"], perm=[1, 0]),
        helper.make_node("MatMul", ["y", "yt"], ["s"], name="scores"),
        helper.make_node("Mul", ["s", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["a"], axis=-1),
        helper.make_node("MatMul", ["a", "y"], ["c"], name="mix"),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MatMul", ["r", "W2"], ["u"], name="out"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 32])],
        [helper.make_tensor_value_info("u", TensorProto.FLOAT, [None, 16])],
        initializer=inits,
    )
    return onnx_model(graph)


def feeds(seed: int) -> list[dict[str, np.ndarray]]:
    return [{"x": feed["x"] * 0.1} for feed in outlier_feeds(seed, width=32)]


def unfused(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    """``model``'s first output in onnxruntime with its graph fusions off: each node computed as written."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def fake_quant(x: np.ndarray, step: np.ndarray | float) -> np.ndarray:
    """QuantizeLinear then DequantizeLinear at zero point 0: saturating to int8's [-128, 127]."""
    return np.clip(np.round(x / step), -128, 127) * step


def test_candidates_are_the_weights_and_the_activation_products() -> None:
    model = attention_like()
    assert matmul_activations(model) == {"project": ["x"], "scores": ["y", "yt"], "mix": ["a", "y"], "out": ["r"]}
    assert static_candidates(model) == ["project", "scores", "mix", "out"]


def test_min_max_ranges_are_the_activations_peaks_and_clipping_methods_stay_below() -> None:
    model, given = attention_like(), feeds(1)
    tensors = ["x", "y", "r"]
    found = calibrate(model, given, tensors)
    assert found.methods() == ["min-max", "percentile", "entropy"]
    assert found.ranges["min-max"]["x"] == pytest.approx(max(float(np.abs(f["x"]).max()) for f in given))
    # y from an independent computation of the first product
    w1 = numpy_helper.to_array(model.graph.initializer[0])
    assert found.ranges["min-max"]["y"] == pytest.approx(max(float(np.abs(f["x"] @ w1).max()) for f in given), 1e-5)
    for method in ("percentile", "entropy"):
        for name in tensors:
            assert 0 < found.ranges[method][name] <= found.ranges["min-max"][name] * (1 + 1e-6)


def test_the_method_is_chosen_on_samples_apart_from_those_it_calibrated_on() -> None:
    """A batch's rows are split one by one, so no sample calibrates and judges (as a row inside a batch)."""
    batch = {"x": np.arange(12, dtype=np.float32).reshape(3, 4)}
    alone = {"x": np.full((1, 4), 7.0, np.float32)}
    rows, masks = sample_rows([batch, alone], [np.ones((3, 4), bool), None])
    assert [r["x"].tolist() for r in rows] == [[row] for row in batch["x"].tolist()] + [alone["x"].tolist()]
    assert [None if m is None else m.shape for m in masks] == [(1, 4), (1, 4), (1, 4), None]
    fit, judged = rows[0::2], rows[1::2]
    assert not {r["x"].tobytes() for r in fit} & {r["x"].tobytes() for r in judged}


def test_the_qdq_graph_computes_the_quantization_numpy_computes() -> None:
    """One MatMul by a weight: onnxruntime's result equals (x quantized with the static step) · (W quantized
    per output channel), both computed here from the ranges and the weight alone."""
    rng = np.random.default_rng(3)
    weight = rng.normal(size=(32, 24)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="project")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 24])],
        initializer=[numpy_helper.from_array(weight, "W")],
    )
    model = onnx_model(graph)
    x = rng.normal(size=(5, 32)).astype(np.float32) * 2
    peak = 3.0  # clips some of x: the range is the calibration's, not this call's
    quantized = qdq_model(model, {"x": peak}, [])
    onnx.checker.check_model(quantized, full_check=True)
    assert qdq_counts(quantized) == {"QuantizeLinear": 1, "DequantizeLinear": 2, "MatMul int8": 1, "MatMul": 1}
    zero_points = [i for i in quantized.graph.initializer if i.data_type == TensorProto.INT8 and not i.dims]
    assert zero_points and all(numpy_helper.to_array(z) == 0 for z in zero_points)  # symmetric (TensorRT)
    column_steps = np.abs(weight).max(axis=0) / 127
    want = fake_quant(x, peak / 127) @ fake_quant(weight, column_steps)
    # The graph's own arithmetic (what TensorRT computes): onnxruntime with its fusions off runs each node as written.
    # With them on, its CPU kernel for the fused int8 product saturates 16-bit sums on AVX2 without VNNI (measured
    # here: 6.2 off on this 32-wide product), which is the host's kernel, not the file.
    got = unfused(quantized, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.abs(got - x @ weight).max() > 1e-3  # the clip and rounding are there


def test_kept_nodes_run_float_with_their_weights_in_float16() -> None:
    model, given = attention_like(), feeds(2)
    ranges = calibrate(model, given, sorted({t for r in matmul_activations(model).values() for t in r}))
    every = qdq_model(model, ranges.ranges["min-max"], [])
    assert qdq_counts(every)["MatMul int8"] == 4
    kept = qdq_model(model, ranges.ranges["min-max"], ["out", "scores"])
    assert qdq_counts(kept)["MatMul int8"] == 2
    halves = [i.name for i in kept.graph.initializer if i.data_type == TensorProto.FLOAT16]
    assert halves == ["W2__fp16"]
    everything = qdq_model(model, ranges.ranges["min-max"], static_candidates(model))
    assert qdq_counts(everything)["QuantizeLinear"] == 0  # an empty list is not "every node" here
    reference = _run(model, given)
    for got, want in zip(_run(everything, given), reference, strict=True):
        # float16 weights only (a rounding of 2^-11 each), through three products
        assert np.abs(got["u"] - want["u"]).max() <= 5e-3 * np.abs(want["u"]).max()


def test_the_search_meets_a_target_all_int8_misses_and_says_what_it_chose() -> None:
    model, given = attention_like(), feeds(4)
    by_cosine = Tolerance(atol=1e9, rtol=1e9, min_cosine=0.5)  # judged by direction only
    loose = static_int8_to_target(model, ChoiceSamples(given, by_cosine), outliers_per_input=0)
    worst = loose.cosine
    assert 0.9 < worst < 0.99999, worst  # all-int8 is close, not exact, on these outlier activations
    asked = static_int8_to_target(model, ChoiceSamples(given, by_cosine), keep=("out",), outliers_per_input=0)
    assert asked.kept_float == ["out"] and qdq_counts(asked.model)["MatMul int8"] == 3
    assert asked.cosine > worst  # what the last product's int8 cost
    # A target all-int8 misses: the search moves activations to float (weight-only int8, no byte more) until the
    # file meets the target with the margin static int8 chooses against; every weight stays int8.
    target = Tolerance(atol=1e9, rtol=1e9, min_cosine=asked.cosine)
    strict = static_int8_to_target(model, ChoiceSamples(given, target), outliers_per_input=0)
    choosing = target.with_cosine_error(STATIC_INT8_CHOICE_SHARE)
    assert strict.passed and strict.cosine >= choosing.min_cosine > target.min_cosine
    assert 1 <= len(strict.kept_float) and not strict.before and strict.float_bytes == 0
    assert weight_dequantized(strict.model) == {"project", "out"}  # int8 weights in the file
    note = " ".join(strict.notes("quantizable nodes"))
    assert "activation ranges by " in note and "on inputs it did not calibrate on" in note
    assert f"chosen against cosine >= {choosing.min_cosine:g}" in note and "weight-only int8" in note


def weight_dequantized(model: onnx.ModelProto) -> set[str]:
    """The MatMuls that read a constant weight through a DequantizeLinear (int8 weights)."""
    return set(weight_dequantizers(model))


def test_where_every_activation_float_misses_weights_go_float16_first() -> None:
    """A target above what int8 weights allow even with every activation float: the weights that cost most go
    float16 (a search of their own, reported first), then the activations the rest allows go back to int8."""
    model, given = attention_like(), feeds(4)
    by_cosine = Tolerance(atol=1e9, rtol=1e9, min_cosine=0.5)
    plan = plan_static_int8(model, ChoiceSamples(given, by_cosine), outliers_per_input=0)
    worst = plan.worst_cosine(plan.build([], plan.products), by_cosine)  # every activation float
    assert worst < 1.0 - 1e-7, worst  # int8 weights cost something even with float activations
    # between that and float: chosen against 1 - (1 - target)/2, which lies above every-activation-float's
    target = Tolerance(atol=1e9, rtol=1e9, min_cosine=1.0 - (1.0 - worst) * 1.9)
    outcome = static_int8_to_target(model, ChoiceSamples(given, target), outliers_per_input=0)
    assert outcome.passed and len(outcome.before) == 1
    float16 = outcome.before[0]
    assert 1 <= len(float16.kept_float) <= 2 and set(float16.kept_float) <= {"project", "out"}
    assert float16.float_bytes > 0 and outcome.float_bytes == 0  # weight-only int8 costs no byte over int8
    halves = [i.name for i in outcome.model.graph.initializer if i.data_type == TensorProto.FLOAT16]
    assert len(halves) == len(float16.kept_float)  # the kept weights, stored float16 (smoothed: W1__smoothed_0__fp16)
    assert weight_dequantized(outcome.model) == {"project", "out"} - set(float16.kept_float)
    assert outcome.cosine >= target.with_cosine_error(STATIC_INT8_CHOICE_SHARE).min_cosine
    assert "every MatMul's activations float" in " ".join(float16.notes("int8 weights"))


def test_a_kept_node_reads_its_activation_float_beside_quantized_readers() -> None:
    """Two MatMuls read x (a layer's query beside its key): the quantizer gives x one QuantizeLinear and made the
    unquantized reader read its DequantizeLinear too. Kept, it reads x itself: its output is the float product
    of x and its float16-stored weight, exactly."""
    rng = np.random.default_rng(5)
    w_query, w_key = (rng.normal(size=(16, 8)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "Wq"], ["q"], name="query"),
            helper.make_node("MatMul", ["x", "Wk"], ["k"], name="key"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 8]) for n in ("q", "k")],
        initializer=[numpy_helper.from_array(w_query, "Wq"), numpy_helper.from_array(w_key, "Wk")],
    )
    model = onnx_model(graph)
    x = rng.normal(size=(4, 16)).astype(np.float32)
    kept = qdq_model(model, {"x": 1.0}, ["query"])  # a range that clips x: quantized x would show
    query = next(node for node in kept.graph.node if node.name == "query")
    assert query.input[0] == "x"
    assert qdq_counts(kept)["MatMul int8"] == 1
    got = unfused(kept, {"x": x})
    np.testing.assert_allclose(got, x @ w_query.astype(np.float16).astype(np.float32), rtol=1e-5, atol=1e-5)


def test_an_op_beside_an_int8_product_reads_the_float_activation() -> None:
    """A MatMul and an Add read x (a feed-forward product beside the residual Add, both reading a LayerNorm's
    output once it is one op): onnxruntime's quantizer has every reader of x read its DequantizeLinear, so the
    residual path would take the int8 rounding. Only the product reads x through the pair; the Add's output is
    x + 1 exactly, while the product still sees x clipped to its range."""
    rng = np.random.default_rng(6)
    weight = rng.normal(size=(8, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="product"), helper.make_node("Add", ["x", "C"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 8]),
        ],
        initializer=[numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.ones(8, np.float32), "C")],
    )
    x = rng.normal(size=(3, 8)).astype(np.float32) * 2
    quantized = qdq_model(onnx_model(graph), {"x": 1.0}, [])  # a range that clips x: quantized x would show
    assert qdq_counts(quantized)["MatMul int8"] == 1
    session = ort.InferenceSession(quantized.SerializeToString(), providers=["CPUExecutionProvider"])
    y, z = session.run(["y", "z"], {"x": x})
    np.testing.assert_array_equal(z, x + 1)
    assert np.abs(y - x @ weight).max() > 0.5  # the product's x is clipped at 1.0


def test_weight_only_multiplies_the_float_activation_by_the_dequantized_weight() -> None:
    rng = np.random.default_rng(6)
    weight = rng.normal(size=(32, 24)).astype(np.float32)
    model = matmul_model(weight)
    x = rng.normal(size=(5, 32)).astype(np.float32) * 4
    quantized = qdq_model(model, {"x": 1.0}, [], weight_only=["product"])  # the range would clip x: not used
    onnx.checker.check_model(quantized, full_check=True)
    assert qdq_counts(quantized) == {"QuantizeLinear": 0, "DequantizeLinear": 1, "MatMul int8": 0, "MatMul": 1}
    assert weight_dequantized(quantized) == {"product"}
    steps = np.abs(weight).max(axis=0) / 127
    np.testing.assert_allclose(unfused(quantized, {"x": x}), x @ fake_quant(weight, steps), rtol=1e-4, atol=1e-4)
