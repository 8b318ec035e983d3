"""Quantized exports run, report their error against float32, and stay within their precision's tolerance."""

from __future__ import annotations

from pathlib import Path

import pytest

from pe_export.api import export_onnx, export_tflite
from pe_export.converters.options import ExportOptions
from pe_export.errors import ExitCode
from pe_export.parity.tolerances import DEFAULT_TOLERANCES
from tests.helpers import independent_verdict, litert_outputs, onnxruntime_outputs, reference_outputs, token_feed

MODEL = "encoder_multi_io"


@pytest.fixture(scope="module")
def fp32_bytes(saved_model, tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """Constant bytes of the fp32 exports."""
    out = tmp_path_factory.mktemp("fp32")
    return {
        "tflite": export_tflite(
            saved_model(MODEL), out / "m.tflite", ExportOptions(verify=False)
        ).summary.constant_bytes,
        "onnx": export_onnx(saved_model(MODEL), out / "m.onnx", ExportOptions(verify=False)).summary.constant_bytes,
    }


@pytest.mark.parametrize(
    ("target", "mode", "precision"),
    [
        ("tflite", "float16", "fp16"),
        ("tflite", "dynamic-int8", "int8"),
        ("tflite", "int8", "int8"),  # full integer (int16 activations): the converter's full int8 missed here
        ("onnx", "float16", "fp16"),
        ("onnx", "dynamic-int8", "int8"),
    ],
)
def test_quantized_export_reports_error(
    target: str, mode: str, precision: str, saved_model, tmp_path: Path, fp32_bytes: dict[str, int]
) -> None:
    export = export_tflite if target == "tflite" else export_onnx
    report = export(saved_model(MODEL), tmp_path / f"m.{target}", ExportOptions(quantize=mode))
    parity = report.parity
    assert parity is not None and parity.precision == precision
    print(
        f"{target} {mode}: file {report.summary.file_bytes:,} B, constants {report.summary.constant_bytes:,} B "
        f"(fp32 constants {fp32_bytes[target]:,} B), "
        f"max abs {parity.max_abs:.3g}, min cosine {parity.min_cosine:.6f}"
    )
    assert report.exit_code == ExitCode.OK
    assert set(parity.tolerances.values()) == {DEFAULT_TOLERANCES[precision]}
    # Really quantized: measurably different from fp32, and its constants take fewer bytes.
    # (File bytes are not asserted: on a 32-wide model the int8 graph's extra nodes outweigh
    # the saved weight bytes for ONNX: 121,941 B against 116,212 B fp32, measured.)
    assert parity.max_abs > 1e-5
    assert report.summary.constant_bytes < fp32_bytes[target]
    # A second judge, apart from the export's own check: the file run straight in its runtime on inputs the
    # export never saw (padding included), against TensorFlow's outputs, by the precision's tolerance.
    feed = token_feed(("attention_mask", "segment_ids", "token_ids"), batch=3, seq_len=24, vocab=64, seed=11)
    run = litert_outputs if target == "tflite" else onnxruntime_outputs
    verdict = independent_verdict(
        run(tmp_path / f"m.{target}", feed),
        reference_outputs(saved_model(MODEL), feed),
        DEFAULT_TOLERANCES[precision],
        valid=feed["attention_mask"],
    )
    print("independent:", verdict)
    assert all(over == 0 and cosine >= DEFAULT_TOLERANCES[precision].min_cosine for over, cosine in verdict.values())
    assert min(cosine for _, cosine in verdict.values()) < 1 - 1e-9  # and really not the float32 model
