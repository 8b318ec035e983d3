"""The same gate as a pytest test: `pytest examples/ci/test_parity.py` in your own CI.

Set PE_EXPORT_MODEL (a .tflite or .onnx) and PE_EXPORT_GOLDEN (a bundle directory).
"""

import os

import pytest

from pe_export.parity.harness import assert_parity


@pytest.mark.skipif("PE_EXPORT_MODEL" not in os.environ, reason="set PE_EXPORT_MODEL and PE_EXPORT_GOLDEN")
def test_exported_model_matches_reference() -> None:
    report = assert_parity(os.environ["PE_EXPORT_MODEL"], os.environ["PE_EXPORT_GOLDEN"])
    assert report.samples > 0
