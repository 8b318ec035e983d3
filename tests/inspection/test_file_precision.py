"""The precision a file's own tensors state (pe_export/inspection/file_precision.py): what an unstamped file,
another tool's, is judged by. Read from real exports and from the bare TFLite converter's own file."""

from __future__ import annotations

from pathlib import Path

import pytest

from pe_export.golden import GoldenOptions, make_golden
from pe_export.inspection.file_precision import file_precision
from pe_export.inspection.onnx_metadata import onnx_metadata
from pe_export.inspection.tflite_metadata import tflite_metadata
from pe_export.parity.harness import check_parity
from pe_export.parity.result import ParityOptions
from pe_export.provenance import PRECISION

CASES = [
    ("tflite", "none"),
    ("tflite", "float16"),
    ("tflite", "dynamic-int8"),
    ("onnx", "none"),
    ("onnx", "float16"),
    ("onnx", "dynamic-int8"),
    ("onnx", "weight-int8"),
]


@pytest.mark.parametrize(("target", "quantize"), CASES)
def test_the_tensors_say_what_the_stamp_says(exported_file, target: str, quantize: str) -> None:
    path = exported_file("encoder_dynamic", target, quantize)
    stamps = tflite_metadata(path) if target == "tflite" else onnx_metadata(path)
    precision, evidence = file_precision(path)
    assert precision == stamps[PRECISION], evidence  # two independent readings of one file agree


def test_an_unstamped_converter_file_is_judged_by_its_int8_weights(saved_model, tmp_path: Path) -> None:
    """The TFLite converter's own dynamic-range file (no pe-export stamp): judged at the int8 tolerance its
    weights call for, where an fp32 default would call the converter's ordinary int8 error a failure."""
    import tensorflow as tf

    model = saved_model("encoder_dynamic")
    converter = tf.lite.TFLiteConverter.from_saved_model(str(model))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    path = tmp_path / "converter.tflite"
    path.write_bytes(converter.convert())
    assert PRECISION not in tflite_metadata(path)
    precision, evidence = file_precision(path)
    assert precision == "int8" and "int8 weight tensor" in evidence, evidence
    make_golden(model, tmp_path / "golden", GoldenOptions(samples=4, batch=2))
    report = check_parity(path, tmp_path / "golden", ParityOptions(isolate=False))
    assert report.precision == "int8" and report.digest == "absent"
    fp32 = check_parity(path, tmp_path / "golden", ParityOptions(isolate=False, precision="fp32"))
    assert max(o.max_abs for o in fp32.outputs) > 1e-4  # int8 error: over the fp32 tolerance the old default used
