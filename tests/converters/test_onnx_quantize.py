"""Accuracy-driven dynamic int8 for ONNX: every node quantized when that meets the target, the most
sensitive ones kept in float when it does not, each step measured in onnxruntime."""

from __future__ import annotations

import re
from pathlib import Path

from pe_export.api import export_onnx
from pe_export.converters.options import ExportOptions
from pe_export.errors import ExitCode


def test_int8_meets_the_target_asked_for(saved_model, tmp_path: Path) -> None:
    model = saved_model("encoder_dynamic")
    default = export_onnx(model, tmp_path / "default.onnx", ExportOptions(quantize="dynamic-int8"))
    assert default.parity is not None and default.parity.min_cosine < 1 - 1e-7  # int8 changed the outputs
    # A target the default misses whatever the random init: a third of the default's distance from cosine 1.
    target = 1 - (1 - default.parity.min_cosine) / 3
    strict = export_onnx(model, tmp_path / "strict.onnx", ExportOptions(quantize="dynamic-int8", min_cosine=target))
    default_note = next(n for n in default.notes if n.startswith("int8:"))
    strict_note = next(n for n in strict.notes if n.startswith("int8:"))
    print(default_note, default.parity.min_cosine, "|", strict_note, strict.parity.min_cosine)
    # 3 MatMuls and 4 attention projections (tf2onnx's Gemm, quantized as MatMul), every one int8.
    assert default.exit_code == ExitCode.OK and "all 7 quantizable nodes quantized" in default_note
    assert "4 Gemm node(s) as MatMul" in default_note
    assert strict.exit_code == ExitCode.OK and {t.min_cosine for t in strict.parity.tolerances.values()} == {target}
    kept = re.search(r"(\d+) of 7 quantizable nodes kept in float", strict_note)
    assert kept and 1 <= int(kept[1]) < 7 and strict.parity.min_cosine >= target
    assert default.summary.file_bytes < strict.summary.file_bytes  # the float nodes cost bytes


def test_weight_only_int8_shrinks_the_file_and_keeps_float_arithmetic(saved_model, tmp_path: Path) -> None:
    from pe_export.inspection.onnx_file import import_onnx

    model = saved_model("encoder_dynamic")
    plain = export_onnx(model, tmp_path / "fp32.onnx", ExportOptions())
    small = export_onnx(model, tmp_path / "w8.onnx", ExportOptions(quantize="weight-int8"))
    note = next(n for n in small.notes if n.startswith("weight-int8:"))
    print(note, plain.summary.file_bytes, small.summary.file_bytes, small.parity.max_abs, small.parity.min_cosine)
    assert small.exit_code == ExitCode.OK and small.parity.min_cosine >= 0.9999
    replaced = int(re.search(r"\(([\d,]+) B of float32 replaced\)", note)[1].replace(",", ""))
    # int8 plus one float32 scale per 32 values is 1.125 B a value instead of 4; graph nodes cost the rest.
    assert plain.summary.file_bytes - small.summary.file_bytes >= 0.5 * replaced > 0
    onnx = import_onnx()
    ops = {node.op_type for node in onnx.load(str(tmp_path / "w8.onnx")).graph.node}
    assert "MatMulInteger" not in ops and "DynamicQuantizeLinear" not in ops  # no integer kernels: float compute


def test_variants_from_one_quantization_equal_the_quantizers_own(saved_model, tmp_path: Path) -> None:
    """A node kept float by editing the all-int8 model computes what quantize_dynamic's nodes_to_exclude
    writes, run in onnxruntime; every node kept float is the float model."""
    import numpy as np
    import onnx

    from pe_export.converters.onnx_quantize import QuantizedVariants, _quantize, _run, int8_ready, quantizable_nodes

    export_onnx(saved_model("encoder_dynamic"), tmp_path / "fp32.onnx", ExportOptions())
    prepared, _ = int8_ready(onnx.load(str(tmp_path / "fp32.onnx")))
    nodes = quantizable_nodes(prepared)
    variants = QuantizedVariants(prepared, _quantize(prepared, []))
    feeds = [
        {i.name: np.ones([2, 16], np.int32) for i in prepared.graph.input},
        {i.name: np.arange(32, dtype=np.int32).reshape(2, 16) % 7 for i in prepared.graph.input},
    ]
    for kept in (nodes[:1], nodes[1::2], nodes[-2:]):
        edited, own = _run(variants.build(kept), feeds), _run(_quantize(prepared, kept), feeds)
        for got, want in zip(edited, own, strict=True):
            for name in want:
                np.testing.assert_array_equal(got[name], want[name])
    as_float, reference = _run(variants.build(nodes), feeds), _run(prepared, feeds)
    for got, want in zip(as_float, reference, strict=True):
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    integer = {"MatMulInteger", "DynamicQuantizeLinear"}
    assert not any(node.op_type in integer for node in variants.build(nodes).graph.node)


def test_nodes_that_share_a_name_are_kept_float_apart() -> None:
    """ONNX allows empty node names (onnxruntime refuses repeated ones, so no file it runs has them); the
    quantizer and the search name nodes. After int8_ready each has its own, and keeping one float keeps that
    one only (onnxruntime runs the variant)."""
    import numpy as np

    from pe_export.converters.onnx_quantize import QuantizedVariants, _quantize, _run, int8_ready, quantizable_nodes
    from tests.converters.test_onnx_smooth import outlier_model

    model = outlier_model()
    model.graph.node[1].name = model.graph.node[3].name = ""  # two of the three MatMuls unnamed
    prepared, _ = int8_ready(model)
    nodes = quantizable_nodes(prepared)
    assert len(nodes) == len(set(nodes)) == 3 and all(nodes)
    variants = QuantizedVariants(prepared, _quantize(prepared, []))
    for kept in nodes:
        built = variants.build([kept])
        float_matmuls = [n.name for n in built.graph.node if n.op_type == "MatMul"]
        assert float_matmuls == [kept]
        x = {"x": np.random.default_rng(3).normal(size=(4, 32)).astype(np.float32)}
        (got,), (want,) = _run(built, [x]), _run(_quantize(prepared, [kept]), [x])
        assert all(np.array_equal(got[k], want[k]) for k in want)
