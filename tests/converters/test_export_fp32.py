"""Every fixture model exports to .tflite and .onnx, and the files match TensorFlow in fp32.

The error is measured twice: by pe-export's own report, and independently here by
running the file straight through ai-edge-litert / onnxruntime against the SavedModel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pe_export.api import export_onnx, export_tflite
from pe_export.converters.options import ExportOptions
from pe_export.encoders.tiny import VOCAB
from pe_export.errors import ExitCode
from tests.fixtures.models import DETERMINISTIC_CASES, MODEL_CASES
from tests.helpers import litert_outputs, max_abs_error, onnx_model, onnxruntime_outputs, reference_outputs, token_feed

FP32_MAX_ABS = 1e-4
BUILTIN_CASES = [name for name in DETERMINISTIC_CASES if not MODEL_CASES[name].flex_ops]


@pytest.mark.parametrize("name", BUILTIN_CASES)
def test_tflite_fp32_matches_tensorflow(name: str, saved_model, tmp_path: Path) -> None:
    case = MODEL_CASES[name]
    output = tmp_path / f"{name}.tflite"
    report = export_tflite(saved_model(name), output, ExportOptions())
    assert report.exit_code == ExitCode.OK
    assert report.parity is not None and report.parity.runtime == "litert"
    assert report.parity.max_abs <= FP32_MAX_ABS
    assert report.summary.flex_ops == []
    # One note per rewrite, in order, with its count: prefix slices of the table (as SLICE), then the slices
    # that needed FlexStridedSlice until rewritten.
    expected = [str(case.notes[key]) for key in ("prefix_slices", "new_axis_slices") if case.notes.get(key)]
    assert [note.split(" ")[0] for note in report.notes] == expected, report.notes
    signature = report.summary.signatures[0]
    assert tuple(sorted(s.name for s in signature.inputs)) == case.input_names
    assert tuple(sorted(s.name for s in signature.outputs)) == case.output_names

    seq_len = case.seq_len or 24  # a length the check itself did not use
    feed = token_feed(case.input_names, batch=3, seq_len=seq_len, vocab=VOCAB)
    error = max_abs_error(litert_outputs(output, feed), reference_outputs(saved_model(name), feed))
    print(f"{name}.tflite fp32 max abs error vs TensorFlow: {error:.3g}")
    assert error <= FP32_MAX_ABS


@pytest.mark.parametrize("name", DETERMINISTIC_CASES)
def test_onnx_fp32_matches_tensorflow(name: str, saved_model, tmp_path: Path) -> None:
    import onnx

    case = MODEL_CASES[name]
    output = tmp_path / f"{name}.onnx"
    report = export_onnx(saved_model(name), output, ExportOptions())
    assert report.exit_code == ExitCode.OK
    assert report.parity is not None and report.parity.max_abs <= FP32_MAX_ABS

    model = onnx.load(str(output))
    onnx.checker.check_model(model, full_check=True)
    ops = {node.op_type for node in model.graph.node}
    assert "Erfc" not in ops and "Erf" in ops  # exact GELU through our Erfc handler
    assert tuple(sorted(i.name for i in model.graph.input)) == case.input_names
    assert tuple(sorted(o.name for o in model.graph.output)) == case.output_names

    seq_len = case.seq_len or 24
    feed = token_feed(case.input_names, batch=3, seq_len=seq_len, vocab=VOCAB)
    error = max_abs_error(onnxruntime_outputs(output, feed), reference_outputs(saved_model(name), feed))
    print(f"{name}.onnx fp32 max abs error vs TensorFlow: {error:.3g}")
    assert error <= FP32_MAX_ABS


def test_gelu_without_our_handler_is_invalid(saved_model) -> None:
    """The landmine the handler defuses: tf2onnx alone writes an Erfc node that ONNX rejects."""
    import onnx
    import tf2onnx
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    from pe_export.savedmodel import load_savedmodel, signature_input_specs, wrap_signature

    loaded = load_savedmodel(saved_model("encoder_dynamic"))
    signature = loaded.signature(None)
    concrete = wrap_signature(signature, signature_input_specs(signature))
    frozen = convert_variables_to_constants_v2(concrete)
    handlers = tf2onnx.handler.tf_op.get_opsets()[""]
    saved = [version_map.pop("Erfc", None) for version_map in handlers]
    tf2onnx.handler.tf_op._MAPPING = None  # rebuild the handler cache without Erfc
    try:
        model, _ = tf2onnx.convert.from_graph_def(
            frozen.graph.as_graph_def(),
            input_names=[t.name for t in frozen.inputs],
            output_names=[t.name for t in frozen.outputs],
            opset=17,
        )
    finally:
        for version_map, handler in zip(handlers, saved, strict=True):
            if handler is not None:
                version_map["Erfc"] = handler
        tf2onnx.handler.tf_op._MAPPING = None
    assert "Erfc" in {node.op_type for node in model.graph.node}
    with pytest.raises(onnx.checker.ValidationError, match="Erfc"):
        onnx.checker.check_model(model, full_check=True)


def test_fixed_model_keeps_fixed_length_and_dynamic_model_stays_dynamic(saved_model, tmp_path: Path) -> None:
    fixed = export_tflite(saved_model("encoder_fixed"), tmp_path / "f.tflite", ExportOptions(verify=False))
    dynamic = export_tflite(saved_model("encoder_dynamic"), tmp_path / "d.tflite", ExportOptions(verify=False))
    assert fixed.summary.signatures[0].inputs[0].shape == (None, 16)
    assert dynamic.summary.signatures[0].inputs[0].shape == (None, None)
    feed = token_feed(("token_ids",), batch=2, seq_len=40, vocab=VOCAB)
    out = litert_outputs(tmp_path / "d.tflite", feed)
    assert out["sequence_output"].shape == (2, 40, 32)
    assert np.isfinite(out["sequence_output"]).all()


def test_onnx_that_onnxruntime_cannot_load_is_a_conversion_error() -> None:
    import onnx
    from onnx import TensorProto, helper

    from pe_export.converters.onnx.convert import check_onnxruntime_loads
    from pe_export.errors import ConversionError

    # Valid for onnx.checker (the op is in a custom domain) but no kernel exists for it.
    node = helper.make_node("NoSuchKernel", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = onnx_model(graph, ("", 17), ("com.example", 1))
    onnx.checker.check_model(model)
    with pytest.raises(ConversionError, match="onnxruntime cannot load"):
        check_onnxruntime_loads(model.SerializeToString())


@pytest.mark.parametrize("signature", [None, "serve"])
def test_tflite_signature_key_is_the_savedmodel_signature(signature: str | None, saved_model, tmp_path: Path) -> None:
    # Keras exports the same function as "serve" and "serving_default"; the file keeps the one asked for.
    report = export_tflite(saved_model("encoder_dynamic"), tmp_path / "m.tflite", ExportOptions(signature=signature))
    assert report.exit_code == ExitCode.OK and report.parity is not None and report.parity.passed
    from ai_edge_litert.interpreter import Interpreter

    assert list(Interpreter(str(tmp_path / "m.tflite")).get_signature_list()) == [signature or "serving_default"]
