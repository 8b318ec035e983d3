"""A machine too small for an export gets one line and exit 2 before any freezing or conversion, unless --force
(pe_export/memory.py). The machine's memory is the one thing faked here: the estimate and the CLI path are real;
and what a conversion frees goes back to the system before the next step."""

from __future__ import annotations

import os
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


def test_weights_counted_from_saved_model_pb_as_loaded(tmp_path: Path) -> None:
    """The count before loading equals the loaded model's variable bytes (each variable once), though
    a Keras export lists every variable twice in its object graph."""
    from pe_export.memory import saved_weight_bytes, weight_bytes
    from pe_export.savedmodel import load_savedmodel
    from tests.fixtures.keras_hub_models import export_random_bert

    path = export_random_bert(tmp_path / "bert", num_layers=2, hidden_dim=64, vocabulary_size=700)
    loaded = load_savedmodel(path)
    expected = weight_bytes(list(loaded.obj.variables))
    assert expected > 700 * 64 * 4  # the token table alone
    assert saved_weight_bytes(path) == expected


def test_weights_counted_without_importing_tensorflow(saved_model) -> None:
    """The plain TFLite path converts in a child; TensorFlow imported in the parent first would add to the peak."""
    import subprocess
    import sys

    code = (
        "import sys; from pathlib import Path; from pe_export.memory import saved_weight_bytes; "
        f"print(saved_weight_bytes(Path({str(saved_model('encoder_dynamic'))!r}))); "
        "print('tensorflow' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    count, imported = done.stdout.split()
    assert int(count) > 0 and imported == "False"


def test_tflite_past_two_gib_is_refused_with_the_ways_through() -> None:
    from pe_export.errors import BadInputError
    from pe_export.memory import TFLITE_MAX_BYTES, check_tflite_size

    xlm_r_large = 2_240_000_000  # 560M float32 parameters
    with pytest.raises(BadInputError) as raised:
        check_tflite_size(xlm_r_large, "none")
    message = str(raised.value)
    assert "\n" not in message
    for fragment in ("2.09 GiB", "past 2 GiB", "--quantize float16 or int8", "--seq-len", "pe-export onnx"):
        assert fragment in message
    check_tflite_size(xlm_r_large, "none", converter_layout=True)  # the converter's own large-file layout
    check_tflite_size(xlm_r_large, "float16")  # 1.04 GiB: quiet
    check_tflite_size(TFLITE_MAX_BYTES, "none")
    with pytest.raises(BadInputError, match="export ONNX"):
        check_tflite_size(4 * TFLITE_MAX_BYTES + 8, "float16")
    with pytest.raises(BadInputError, match="float32 TFLite file dynamic-int8 converts"):
        check_tflite_size(xlm_r_large, "dynamic-int8", converter_layout=True)


def test_onnx_past_two_gib_refuses_only_the_searches() -> None:
    """dynamic-int8 and float16 (arithmetic) run the float model from bytes in onnxruntime as they choose."""
    from pe_export.errors import BadInputError
    from pe_export.memory import check_onnx_size

    for quantize in ("none", "weight-float16", "weight-int8"):
        check_onnx_size(2_240_000_000, quantize)
    for quantize in ("dynamic-int8", "float16"):
        check_onnx_size(10**9, quantize)
        with pytest.raises(BadInputError, match=f"--quantize {quantize} for ONNX.*weight-int8 or weight-float16"):
            check_onnx_size(2_240_000_000, quantize)


def _resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_freed_heap_goes_back_to_the_system() -> None:
    """What a converter frees stays in a glibc heap until malloc_trim: 256 MB of 4 kB blocks, freed under a block
    still in use (so that free() cannot shrink the heap from its top), go back to the system when asked."""
    import ctypes.util

    from pe_export.memory import release_freed_memory

    if not Path("/proc/self/statm").exists() or "libc" not in (ctypes.util.find_library("c") or ""):
        pytest.skip("glibc on Linux only: elsewhere release_freed_memory does nothing")
    blocks = [bytearray(4096) for _ in range(65_536)]
    kept = bytearray(4096)  # above the blocks in the heap
    before = _resident_bytes()
    del blocks
    freed = _resident_bytes()
    release_freed_memory()
    after = _resident_bytes()
    assert kept is not None
    assert freed - after >= 0.75 * 256 * 2**20, (before, freed, after)
