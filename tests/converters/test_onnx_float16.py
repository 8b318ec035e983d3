"""ONNX float16 arithmetic (pe_export/converters/onnx/float16.py): which nodes compute in float16 is decided by the op
and by the values measured on the inputs, the casts sit where the precision changes, and the file is valid, runs in
onnxruntime, and computes what float16 arithmetic computes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from pe_export.converters.onnx.float16 import (
    FLOAT16,
    FLOAT16_SAFE_MAX,
    captured_peaks,
    float_tensors,
    plan_float16,
    to_float16,
)
from pe_export.converters.search.keep_float import ChoiceSamples
from tests.helpers import onnx_model


def small_graph(big: float) -> Any:
    """x → MatMul(W) → Mul(by ``big``) → Add(b) → y, and a comparison of x against a ±1e9 sentinel → mask output:
    the Mul's output reaches |x·W|·big, so ``big`` decides whether it fits float16."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(size=(8, 4)).astype(np.float32), "W")
    scale = numpy_helper.from_array(np.array(big, np.float32), "big")
    bias = numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "b")
    sentinel = numpy_helper.from_array(np.array(1e9, np.float32), "sentinel")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"], name="matmul"),
        helper.make_node("Mul", ["xw", "big"], ["scaled"], name="scale"),
        helper.make_node("Add", ["scaled", "b"], ["y"], name="bias"),
        helper.make_node("Less", ["x", "sentinel"], ["mask"], name="below_sentinel"),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, ["n", 8]),
        ],
        [weight, scale, bias, sentinel],
    )
    return onnx_model(graph)


def each_output(model: Any, feeds: list[dict[str, np.ndarray]], names: list[str]) -> Iterator[dict[str, np.ndarray]]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        yield dict(zip(names, session.run(names, feed), strict=True))


FEEDS = [{"x": np.random.default_rng(seed).normal(size=(3, 8)).astype(np.float32)} for seed in range(4)]


def test_values_in_range_compute_in_float16_and_the_file_keeps_float32_io() -> None:
    model = small_graph(2.0)
    peaks, expected = captured_peaks(model, FEEDS, each_output)
    plan = plan_float16(model, peaks)
    assert plan.float16 == {"matmul", "scale", "bias"}
    assert "not an arithmetic op" in plan.float32["below_sentinel"]  # a comparison: float32 whatever its values
    half = to_float16(model, plan)
    onnx.checker.check_model(half, full_check=True)
    types = float_tensors(half)
    assert [types[name] for name in ("W__fp16", "b__fp16", "big__fp16")] == [FLOAT16] * 3
    assert half.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # float32 at the outputs
    casts = [node for node in half.graph.node if node.op_type == "Cast"]
    assert [(c.input[0], c.output[0]) for c in casts] == [("x", "x__as_fp16"), ("y__fp16", "y")]
    session = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed, want in zip(FEEDS, expected, strict=True):
        got = dict(zip(["y", "mask"], session.run(["y", "mask"], feed), strict=True))
        # float16 arithmetic computed independently: every operand and result rounded to float16
        f16 = np.float16
        xw = (feed["x"].astype(f16).astype(np.float32) @ np.asarray(half_of(model, "W"), np.float32)).astype(f16)
        independent = (xw * f16(2.0)).astype(f16) + half_of(model, "b")
        assert np.abs(got["y"] - independent.astype(np.float32)).max() <= 2e-2
        assert np.abs(got["y"] - want["y"]).max() <= 5e-2 and np.array_equal(got["mask"], want["mask"])
        assert np.abs(got["y"] - want["y"]).max() > 0  # it is float16 arithmetic, not float32's


def half_of(model: Any, name: str) -> np.ndarray:
    from onnx import numpy_helper

    return next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == name).astype(np.float16)


def test_a_value_past_float16s_range_keeps_its_nodes_float32() -> None:
    """x·W·3e4 reaches past half of 65504 on these inputs: the Mul that makes it and the Add that reads it stay
    float32, the MatMul before them runs in float16, and the file matches float32 closely."""
    model = small_graph(3e4)
    peaks, expected = captured_peaks(model, FEEDS, each_output)
    assert peaks["scaled"] > FLOAT16_SAFE_MAX and peaks["xw"] < FLOAT16_SAFE_MAX
    plan = plan_float16(model, peaks)
    assert plan.float16 == {"matmul"}
    assert "beyond float16's safe range" in plan.float32["scale"] and "scaled reaches" in plan.float32["bias"]
    half = to_float16(model, plan)
    onnx.checker.check_model(half, full_check=True)
    casts = [(c.input[0], c.output[0]) for c in half.graph.node if c.op_type == "Cast"]
    assert casts == [("x", "x__as_fp16"), ("xw", "xw__as_fp32")]
    session = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed, want in zip(FEEDS, expected, strict=True):
        got = session.run(["y"], feed)[0]
        assert np.isfinite(got).all()
        assert np.abs(got - want["y"]).max() <= 1e-3 * np.abs(want["y"]).max()  # float16 operands of the MatMul


def test_a_tensor_never_measured_stays_float32() -> None:
    model = small_graph(2.0)
    plan = plan_float16(model, {})  # nothing captured: nothing is known to fit
    assert plan.float16 == set()


def test_the_export_computes_in_float16_and_says_what_stayed_float32(saved_model, tmp_path: Path) -> None:
    from pe_export.api import export_onnx
    from pe_export.converters.options import ExportOptions
    from pe_export.errors import BadInputError, ExitCode

    model = saved_model("encoder_multi_io")
    report = export_onnx(model, tmp_path / "m.onnx", ExportOptions(quantize="float16"))
    assert report.exit_code == ExitCode.OK and report.parity is not None and report.parity.passed
    written = onnx.load(str(tmp_path / "m.onnx"))
    onnx.checker.check_model(written, full_check=True)
    types = float_tensors(written)
    matmuls = [node for node in written.graph.node if node.op_type in ("MatMul", "Gemm")]
    assert matmuls and all(types.get(node.input[0]) == FLOAT16 for node in matmuls)
    plan_note = next(note for note in report.notes if "nodes compute in float16" in note)
    assert f"({len(matmuls)} of {len(matmuls)} MatMul/Gemm)" in plan_note
    assert any(note.startswith("float16 chose on generated inputs") for note in report.notes), report.notes
    # steering: a node named stays float32; a name that matches none is refused with some that would. (A node of
    # the SavedModel's graph: tf2onnx numbers the nodes it makes, Gemm__551, by a counter that runs on in a process.)
    name = next(node.name for node in matmuls if not re.search(r"__\d+$", node.name))
    kept = export_onnx(model, tmp_path / "k.onnx", ExportOptions(quantize="float16", keep_float=(name,)))
    assert kept.exit_code == ExitCode.OK
    again = onnx.load(str(tmp_path / "k.onnx"))
    node = next(n for n in again.graph.node if n.name == name)
    assert float_tensors(again).get(node.input[0]) == onnx.TensorProto.FLOAT
    with pytest.raises(BadInputError, match="names no float16 node of this file"):
        export_onnx(model, tmp_path / "x.onnx", ExportOptions(quantize="float16", keep_float=("no_such_node",)))
    assert not (tmp_path / "x.onnx").exists()


def scaling_graph() -> Any:
    """y = x * 0.001 * 1000 * 2: float16 holds 1000 and 2 exactly and 0.001 only to 4e-4, so the first Mul is the one
    node whose float16 form moves the result (onnxruntime's CPU provider keeps its own casts' values in float32
    between nodes it has no float16 kernel for: what a node computes in float16 here is its constants' storage)."""
    from onnx import TensorProto, helper, numpy_helper

    constants = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("milli", 1e-3), ("kilo", 1e3))]
    constants.append(numpy_helper.from_array(np.array(2.0, np.float32), "two"))
    nodes = [
        helper.make_node("Mul", ["x", "milli"], ["small"], name="to_milli"),
        helper.make_node("Mul", ["small", "kilo"], ["back"], name="from_milli"),
        helper.make_node("Mul", ["back", "two"], ["y"], name="double"),
    ]
    graph = helper.make_graph(
        nodes,
        "scaling",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
        constants,
    )
    return onnx_model(graph)


def test_the_search_keeps_float32_the_node_float16_loses() -> None:
    from pe_export.converters.onnx.float16 import float16_to_target
    from pe_export.parity.tolerances import Tolerance

    tolerance = Tolerance(atol=1e-6, rtol=1e-4, min_cosine=0.9999999)
    graph = scaling_graph()
    everything = to_float16(graph, plan_float16(graph, {"x": 4.0, "small": 4e-3, "back": 4.0, "y": 8.0}))
    half = ort.InferenceSession(everything.SerializeToString(), providers=["CPUExecutionProvider"])
    loss = max(float(np.abs(half.run(["y"], f)[0] - 2 * f["x"]).max() / np.abs(2 * f["x"]).max()) for f in FEEDS)
    assert loss > 2e-4  # all of it in float16 misses the target: what the search is for
    model, notes = float16_to_target(graph, ChoiceSamples(FEEDS, tolerance))
    kept = re.search(r"float16: (\d) of 3 float nodes kept in float32, .*which meets the target", notes[0])
    assert kept and int(kept[1]) < 3, notes
    types = float_tensors(model)
    first = next(node for node in model.graph.node if node.name == "to_milli")
    assert types.get(first.input[1]) == onnx.TensorProto.FLOAT  # 0.001 kept in float32
    assert any(types.get(node.input[0]) == FLOAT16 for node in model.graph.node if node.op_type == "Mul")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in FEEDS:  # judged independently: 2x, within the target
        want = 2 * feed["x"]
        assert np.abs(session.run(["y"], feed)[0] - want).max() <= tolerance.atol + tolerance.rtol * np.abs(want).max()


def test_a_target_only_float32_meets_is_refused_and_nothing_is_made() -> None:
    from pe_export.converters.onnx.float16 import float16_to_target
    from pe_export.errors import ParityError
    from pe_export.parity.tolerances import Tolerance

    # every node's constant is one float16 rounds (2.1 too): only all of them in float32 meets 1e-7
    with pytest.raises(ParityError, match="float16: no file with a float16 node meets the target"):
        float16_to_target(small_graph(2.1), ChoiceSamples(FEEDS, Tolerance(atol=1e-7, rtol=0.0, min_cosine=0.99999999)))
