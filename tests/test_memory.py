"""A machine too small for an export gets one line and exit 2 before any freezing or conversion, unless --force
(pe_export/memory.py). The machine's memory is the one thing faked here: the estimate and the CLI path are real."""

from __future__ import annotations

from pathlib import Path

import pytest

from pe_export.memory import FIXED_BYTES, PEAK_PER_WEIGHT_BYTE, check_fits, estimate
from tests.helpers import assert_one_line_error, run_cli


def test_estimate_grows_with_the_weights_and_int8_asks_more() -> None:
    small, large = estimate(10**8, "tflite", "none", 10**12), estimate(10**9, "tflite", "none", 10**12)
    assert large.needed_bytes - small.needed_bytes == pytest.approx(PEAK_PER_WEIGHT_BYTE["tflite"] * 9 * 10**8)
    assert estimate(10**9, "tflite", "dynamic-int8", 10**12).needed_bytes > large.needed_bytes
    assert estimate(10**9, "onnx", "none", 10**12).needed_bytes > large.needed_bytes  # tf2onnx's graph copies
    assert small.fits and not estimate(10**9, "onnx", "none", FIXED_BYTES).fits


def test_refusal_names_the_estimate_the_memory_and_the_ways_through() -> None:
    from pe_export.errors import BadInputError

    with pytest.raises(BadInputError) as raised:
        check_fits(2 * 10**9, "tflite", "none", available=4 * 10**9)
    message = str(raised.value)
    assert "\n" not in message
    for fragment in ("needs about 17.0 GB", "2,000 MB of weights", "4.0 GB is available", "pe-export onnx", "--force"):
        assert fragment in message
    check_fits(2 * 10**8, "tflite", "none", available=4 * 10**9)  # fits: quiet


@pytest.mark.parametrize("file_format", ["tflite", "onnx"])
def test_cli_refuses_a_machine_too_small_and_force_goes_through(
    capfd, saved_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_format: str
) -> None:
    monkeypatch.setattr("pe_export.memory.available_memory", lambda: FIXED_BYTES // 2)
    out = tmp_path / f"m.{file_format}"
    refused = run_cli(capfd, file_format, saved_model("encoder_dynamic"), "-o", out)
    assert_one_line_error(refused, 2, "GB of memory", "GB is available", "--force")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    forced = run_cli(capfd, file_format, saved_model("encoder_dynamic"), "-o", out, "--force")
    assert forced.exit_code == 0, forced.stderr
    assert out.exists()
