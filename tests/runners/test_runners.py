"""Runner registry and provider checks (no hardware needed: the errors are the point)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pe_export.errors import BadInputError, RuntimeUnavailableError
from pe_export.runners import create_runner, runner_names, runners_for_file


def test_registry_lists_and_rejects() -> None:
    assert runner_names() == ["litert", "onnxruntime", "tflite-runtime", "tflite-tf"]
    assert runners_for_file(Path("m.tflite")) == ["litert", "tflite-runtime", "tflite-tf"]
    with pytest.raises(BadInputError, match="expected one of: litert, onnxruntime"):
        create_runner("tensorrt-native", Path("m.onnx"))
    with pytest.raises(BadInputError, match=r"runs \.onnx files"):
        create_runner("onnxruntime", Path("m.tflite"))


def test_unknown_provider_is_bad_input() -> None:
    with pytest.raises(BadInputError, match="unknown provider 'rocm'"):
        create_runner("onnxruntime", Path("m.onnx"), providers=("rocm",))


def test_unavailable_provider_is_an_error_not_a_cpu_fallback(tmp_path: Path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has CUDA; the refusal path needs a CPU-only onnxruntime")
    runner = create_runner("onnxruntime", tmp_path / "m.onnx", providers=("cuda", "cpu"))
    with pytest.raises(RuntimeUnavailableError, match="CUDAExecutionProvider not available"):
        runner.activate()
