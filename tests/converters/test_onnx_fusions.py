"""LayerNorms and Tensordots as single ops: fused where the nodes compute them, left alone otherwise."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pe_export.api import export_onnx
from pe_export.converters.onnx.fusions import fuse_for_runtime
from pe_export.converters.options import ExportOptions
from pe_export.encoders.tiny import VOCAB
from pe_export.errors import ExitCode
from tests.fixtures.models import MODEL_CASES
from tests.helpers import max_abs_error, onnx_model, onnxruntime_outputs, reference_outputs, run_cli, token_feed

WIDTH, EPSILON = 8, 1e-6
RNG = np.random.default_rng(0)
GAMMA, BETA = RNG.normal(size=WIDTH).astype(np.float32), RNG.normal(size=WIDTH).astype(np.float32)
FP32_MAX_ABS = 1e-4  # the export's float32 tolerance: a fused file is held to the same


def layer_norm_graph(
    rank: int = 3, extra_output: str | None = None, opset: int = 17, dtype: type = np.float32
) -> onnx.ModelProto:
    """tf2onnx's LayerNorm, node for node: GlobalAveragePool mean and variance, Sqrt, Reciprocal, the scale and
    shift as x*g + (beta + (-mean)*g). ``extra_output``: an intermediate also made a graph output."""
    shape = [None] * (rank - 1) + [WIDTH]
    kind = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["mean"]),
        helper.make_node("Sub", ["x", "mean"], ["centred"]),
        helper.make_node("Mul", ["centred", "centred"], ["squared"]),
        helper.make_node("GlobalAveragePool", ["squared"], ["variance"]),
        helper.make_node("Add", ["variance", "epsilon"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["std"]),
        helper.make_node("Reciprocal", ["std"], ["inverse"]),
        helper.make_node("Mul", ["inverse", "gamma"], ["scale"]),
        helper.make_node("Mul", ["x", "scale"], ["x_scaled"]),
        helper.make_node("Neg", ["mean"], ["negated"]),
        helper.make_node("Mul", ["negated", "scale"], ["mean_scaled"]),
        helper.make_node("Add", ["mean_scaled", "beta"], ["shift"]),
        helper.make_node("Add", ["x_scaled", "shift"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", kind, shape)]
    if extra_output:
        outputs.append(helper.make_tensor_value_info(extra_output, kind, None))
    graph = helper.make_graph(
        nodes,
        "layer_norm",
        [helper.make_tensor_value_info("x", kind, shape)],
        outputs,
        initializer=[
            numpy_helper.from_array(np.array(EPSILON, dtype), "epsilon"),
            numpy_helper.from_array(GAMMA.astype(dtype), "gamma"),
            numpy_helper.from_array(BETA.astype(dtype), "beta"),
        ],
    )
    return onnx_model(graph, ("", opset))


def tensordot_graph(indices: list[int] | None = None) -> onnx.ModelProto:
    """tf2onnx's Tensordot: Reshape(x, [-1, K]) -> MatMul(W) -> Reshape(Concat(Shape(x)[indices], [N])).
    ``indices`` other than [0, 1] build an output shape that is not x's leading dimensions."""
    k, n = WIDTH, 5
    nodes = [
        helper.make_node("Reshape", ["x", "flat"], ["x_flat"]),
        helper.make_node("MatMul", ["x_flat", "w"], ["y_flat"]),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Cast", ["x_shape"], ["x_shape32"], to=TensorProto.INT32),
        helper.make_node("Gather", ["x_shape32", "free"], ["leading"], axis=0),
        helper.make_node("Concat", ["leading", "columns"], ["shape32"], axis=0),
        helper.make_node("Cast", ["shape32"], ["shape"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["y_flat", "shape"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tensordot",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, n])],
        initializer=[
            numpy_helper.from_array(np.array([-1, k], np.int64), "flat"),
            numpy_helper.from_array(RNG.normal(size=(k, n)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array(indices or [0, 1], np.int32), "free"),
            numpy_helper.from_array(np.array([n], np.int32), "columns"),
        ],
    )
    return onnx_model(graph)


HEADS, HEAD_WIDTH = 2, 3
W_NK = RNG.normal(size=(HEADS * HEAD_WIDTH, HEADS * HEAD_WIDTH)).astype(np.float32)  # Gemm(transB=1)'s [N, K]


def einsum_projection_graph(
    kind: str, leading: list[int] | None = None, squeezed: int | None = None
) -> onnx.ModelProto:
    """tf2onnx's lowering of an EinsumDense, node for node. ``kind`` "heads" (``abc,cde->abde``, the query/key/value):
    x [B, T, K] Unsqueezed to rank 5, Reshape [-1, K], Gemm(transB) by W [N, K], Reshape to Shape(s)[0, 1] + a
    Gather of a Constant's dims + [1], Squeeze(4) -> [B, T, H, D]. "merge" (``abcd,cde->abe``, the attention
    output): x [B, T, H, D] Unsqueezed to [B, T, 1, H, D], Reshape [-1, ReduceProd(Shape(s)[3, 4])], Gemm, Reshape
    to Shape(s)[0, 1] + [N, 1, 1], Squeeze(3, 4) -> [B, T, N]. ``leading``: the Gather of Shape(s) (a transposed
    one is not the product's shape); ``squeezed``: a Squeeze axis other than the pattern's."""
    k = n = HEADS * HEAD_WIDTH
    weight = numpy_helper.from_array(W_NK, "w")
    initializers = [
        weight,
        numpy_helper.from_array(np.array(leading or [0, 1], np.int64), "leading_axes"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
    ]
    if kind == "heads":
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, k])]
        initializers += [
            numpy_helper.from_array(np.array([2, 3], np.int64), "new_axes"),
            numpy_helper.from_array(np.array([-1, k], np.int64), "flat"),
            numpy_helper.from_array(np.array([2, 3], np.int64), "head_axes"),
            numpy_helper.from_array(np.array([squeezed if squeezed is not None else 4], np.int64), "squeeze_axes"),
        ]
        dims = numpy_helper.from_array(np.array([1, 1, HEADS, HEAD_WIDTH, k], np.int64), "dims")
        nodes = [
            helper.make_node("Unsqueeze", ["x", "new_axes"], ["s"]),
            helper.make_node("Reshape", ["s", "flat"], ["s_flat"]),
            helper.make_node("Gemm", ["s_flat", "w"], ["y_flat"], transB=1, alpha=1.0, beta=0.0),
            helper.make_node("Shape", ["s"], ["s_shape"]),
            helper.make_node("Gather", ["s_shape", "leading_axes"], ["lead"], axis=0),
            helper.make_node("Constant", [], ["w_dims"], value=dims),
            helper.make_node("Gather", ["w_dims", "head_axes"], ["heads"], axis=0),
            helper.make_node("Concat", ["lead", "heads", "one"], ["unflat"], axis=0),
            helper.make_node("Reshape", ["y_flat", "unflat"], ["y5"]),
            helper.make_node("Squeeze", ["y5", "squeeze_axes"], ["y"]),
        ]
        output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, HEADS, HEAD_WIDTH])
    else:
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, HEADS, HEAD_WIDTH])]
        initializers += [
            numpy_helper.from_array(np.array([2], np.int64), "new_axes"),
            numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
            numpy_helper.from_array(np.array([3, 4], np.int64), "merged_axes"),
            numpy_helper.from_array(np.array([n, 1, 1], np.int64), "columns"),
            numpy_helper.from_array(np.array([3, squeezed if squeezed is not None else 4], np.int64), "squeeze_axes"),
        ]
        nodes = [
            helper.make_node("Unsqueeze", ["x", "new_axes"], ["s"]),
            helper.make_node("Shape", ["s"], ["s_shape"]),
            helper.make_node("Gather", ["s_shape", "merged_axes"], ["merged"], axis=0),
            helper.make_node("ReduceProd", ["merged"], ["inner"], keepdims=1),
            helper.make_node("Concat", ["minus_one", "inner"], ["flat"], axis=0),
            helper.make_node("Reshape", ["s", "flat"], ["s_flat"]),
            helper.make_node("Gemm", ["s_flat", "w"], ["y_flat"], transB=1),
            helper.make_node("Gather", ["s_shape", "leading_axes"], ["lead"], axis=0),
            helper.make_node("Concat", ["lead", "columns"], ["unflat"], axis=0),
            helper.make_node("Reshape", ["y_flat", "unflat"], ["y5"]),
            helper.make_node("Squeeze", ["y5", "squeeze_axes"], ["y"]),
        ]
        output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, n])
    return onnx_model(helper.make_graph(nodes, kind, inputs, [output], initializer=initializers))


def run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def flattened_products(model: onnx.ModelProto) -> int:
    """MatMuls by a constant [K, N] weight whose input is reshaped to [-1, K] and whose output only a Reshape reads."""
    producer = {output: node for node in model.graph.node for output in node.output}
    readers: dict[str, list[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.op_type)
    constants = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    found = 0
    for node in (node for node in model.graph.node if node.op_type == "MatMul"):
        weight, flatten = constants.get(node.input[1]), producer.get(node.input[0])
        if weight is None or weight.ndim != 2 or flatten is None or flatten.op_type != "Reshape":
            continue
        shape = constants.get(flatten.input[1])
        flat = shape is not None and shape.tolist() == [-1, weight.shape[0]]
        found += flat and readers.get(node.output[0]) == ["Reshape"]
    return found


def ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(node.op_type for node in model.graph.node)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_layer_norm_becomes_one_op_that_computes_the_same(dtype: type) -> None:
    model = layer_norm_graph(dtype=dtype)
    x = (RNG.normal(size=(2, 5, WIDTH)) * 3 + 1).astype(dtype)
    before = run(model, x)[0]
    fusions = fuse_for_runtime(model)
    onnx.checker.check_model(model, full_check=True)
    assert (fusions.layer_norms, fusions.tensordots, fusions.nodes_after) == (1, 0, 1)
    assert ops(model) == {"LayerNormalization": 1}
    after = run(model, x)[0]
    assert after.dtype == dtype
    wide = x.astype(np.float64)
    mean, var = wide.mean(-1, keepdims=True), wide.var(-1, keepdims=True)
    independent = (wide - mean) / np.sqrt(var + EPSILON) * GAMMA.astype(dtype) + BETA.astype(dtype)
    bound = 1e-5 if dtype == np.float32 else 1e-2  # float16: 2^-11 of values up to ~3
    assert np.abs(after - independent).max() <= bound
    assert np.abs(after.astype(np.float64) - before).max() <= bound


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (layer_norm_graph(rank=4), "GlobalAveragePool of a rank-4 tensor averages two axes, not the last"),
        (layer_norm_graph(extra_output="centred"), "an intermediate is read outside the pattern"),
        (layer_norm_graph(opset=16), "LayerNormalization is not an op before opset 17"),
    ],
)
def test_layer_norm_left_where_the_graph_computes_something_else(model: onnx.ModelProto, why: str) -> None:
    nodes = len(model.graph.node)
    fusions = fuse_for_runtime(model)
    assert (fusions.layer_norms, fusions.nodes_after) == (0, nodes), why


def test_tensordot_becomes_one_matmul_that_computes_the_same() -> None:
    model = tensordot_graph()
    x = RNG.normal(size=(3, 4, WIDTH)).astype(np.float32)
    before = run(model, x)[0]
    fusions = fuse_for_runtime(model)
    onnx.checker.check_model(model, full_check=True)
    assert (fusions.tensordots, fusions.nodes_after) == (1, 1)
    assert ops(model) == {"MatMul": 1} and model.graph.node[0].output[0] == "y"  # the output keeps its name
    after = run(model, x)[0]
    assert after.shape == (3, 4, 5)
    np.testing.assert_array_equal(after, before)


def test_tensordot_left_where_the_output_shape_is_not_the_inputs_leading_dims() -> None:
    model = tensordot_graph(indices=[1, 0])  # [T, B, N]: a transpose of the shape, not the product's
    fusions = fuse_for_runtime(model)
    assert (fusions.tensordots, fusions.nodes_after) == (0, 8)


@pytest.mark.parametrize(
    ("kind", "ops_after"),
    [
        ("heads", {"MatMul": 1, "Reshape": 1}),  # by [0, 0, H, D]: the heads split by constants
        ("merge", {"Unsqueeze": 1, "Reshape": 1, "MatMul": 1}),  # [B, T, 1, H, D] to [0, 0, -1], then the product
    ],
)
def test_einsum_projection_becomes_one_matmul_that_computes_the_same(kind: str, ops_after: dict[str, int]) -> None:
    model = einsum_projection_graph(kind)
    shape = (3, 4, HEADS * HEAD_WIDTH) if kind == "heads" else (3, 4, HEADS, HEAD_WIDTH)
    x = RNG.normal(size=shape).astype(np.float32)
    before = run(model, x)[0]
    fusions = fuse_for_runtime(model)
    onnx.checker.check_model(model, full_check=True)
    assert fusions.projections == 1 and ops(model) == ops_after, ops(model)
    assert model.graph.node[-1].output[0] == "y"  # the output keeps its name
    weights = [init for init in model.graph.initializer if len(init.dims) == 2]
    assert [(w.name, list(w.dims)) for w in weights] == [("w", [HEADS * HEAD_WIDTH] * 2)]  # one weight, [K, N]
    (weight,) = weights
    np.testing.assert_array_equal(numpy_helper.to_array(weight), W_NK.T)  # the Gemm's transB weight, transposed
    after = run(model, x)[0]
    assert after.shape == before.shape
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("kind", "leading", "squeezed", "why"),
    [
        ("heads", [1, 0], None, "the output's leading dimensions are a transpose of the input's"),
        ("heads", None, 3, "the Squeeze would remove a head dimension, not the trailing 1"),
        ("merge", [1, 0], None, "the output's leading dimensions are a transpose of the input's"),
    ],
)
def test_einsum_projection_left_where_the_nodes_compute_something_else(
    kind: str, leading: list[int] | None, squeezed: int | None, why: str
) -> None:
    model = einsum_projection_graph(kind, leading, squeezed)
    nodes = len(model.graph.node)
    fusions = fuse_for_runtime(model)
    assert (fusions.projections, len(model.graph.node)) == (0, nodes), why
    assert ops(model)["Gemm"] == 1


def test_exported_encoder_runs_fused_ops_within_float32_tolerance(saved_model, tmp_path: Path) -> None:
    """A real Keras encoder through tf2onnx: every Keras LayerNormalization is one op in the file, no
    Tensordot reshape is left, and the file still matches TensorFlow on inputs the export never saw."""
    import keras

    case = MODEL_CASES["encoder_multi_io"]
    saved = saved_model(case.name)
    output = tmp_path / "fused.onnx"
    report = export_onnx(saved, output, ExportOptions())
    assert report.exit_code == ExitCode.OK
    model = onnx.load(str(output))
    keras_norms = sum(isinstance(layer, keras.layers.LayerNormalization) for layer in case.build().layers)
    counts = ops(model)
    assert keras_norms > 0 and counts["LayerNormalization"] == keras_norms
    assert counts["GlobalAveragePool"] == 0
    assert flattened_products(model) == 0
    assert counts["Gemm"] == 0  # the attention's einsum projections, tf2onnx's 2-D Gemms, are 3-D MatMuls
    assert any("LayerNormalization" in note for note in report.notes), report.notes
    gpu = next(verdict for verdict in report.summary.runs_on if verdict.runtime == "onnxruntime-gpu")
    assert "TensorRT needs 8.6 or later for LayerNormalization" in gpu.why, gpu  # JetPack 5's 8.5 has none
    feed = token_feed(case.input_names, batch=3, seq_len=21, vocab=VOCAB)
    assert max_abs_error(onnxruntime_outputs(output, feed), reference_outputs(saved, feed)) <= FP32_MAX_ABS


def test_no_fuse_keeps_tf2onnx_graph_as_written(saved_model, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """`--no-fuse` (a runtime without LayerNormalization): the elementwise LayerNorms and the Tensordot reshapes
    stay, and the file still passes its gate."""
    output = tmp_path / "unfused.onnx"
    result = run_cli(capfd, "onnx", saved_model("encoder_multi_io"), "-o", output, "--no-fuse")
    assert result.exit_code == ExitCode.OK, result.stderr
    model = onnx.load(str(output))
    counts = ops(model)
    assert counts["LayerNormalization"] == 0 and counts["GlobalAveragePool"] > 0
    assert flattened_products(model) > 0
    assert "LayerNormalization" not in result.stdout
