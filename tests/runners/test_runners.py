"""Runner registry and provider checks (no hardware needed: the errors are the point)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

import pytest

from pe_export.errors import BadInputError, RuntimeUnavailableError
from pe_export.runners import create_runner, runner_names, runner_options, runners_for_file
from pe_export.runners.onnxrt import TF32_ENV


def test_registry_lists_and_rejects() -> None:
    assert runner_names() == ["litert", "tflite-runtime", "tflite-tf", "litert-gpu", "onnxruntime"]
    assert runners_for_file(Path("m.tflite")) == ["litert", "tflite-runtime", "tflite-tf", "litert-gpu"]
    with pytest.raises(
        BadInputError, match=r"expected one of: litert, tflite-runtime, tflite-tf, litert-gpu, onnxruntime$"
    ):
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


# TensorRT asked for no reduced precision: a float32 engine (tests/runners/test_tensorrt_options.py: the modes)
FLOAT32_BUILD = ("TensorrtExecutionProvider", {"trt_fp16_enable": "0", "trt_int8_enable": "0"})
GPU_ORT_PROVIDERS = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


class RecordingSession:
    """Stands in for a GPU onnxruntime's session (this machine has no CUDA): records its providers."""

    made: ClassVar[list[list[object]]] = []

    def __init__(self, path: str, sess_options: object, providers: list[object]) -> None:
        RecordingSession.made.append(providers)

    def get_providers(self) -> list[str]:
        return GPU_ORT_PROVIDERS


@pytest.fixture
def gpu_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> list[list[object]]:
    import onnxruntime as ort

    monkeypatch.setattr(ort, "get_available_providers", lambda: GPU_ORT_PROVIDERS)
    monkeypatch.setattr(ort, "InferenceSession", RecordingSession)
    RecordingSession.made.clear()
    return RecordingSession.made


@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_providers_compute_float32_unless_tf32_is_asked(
    tf32: bool, gpu_onnxruntime: list[list[object]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TF32_ENV, raising=False)
    runner = create_runner("onnxruntime", tmp_path / "m.onnx", providers=("tensorrt", "cuda", "cpu"), tf32=tf32)
    runner.activate()
    flag = "1" if tf32 else "0"
    assert gpu_onnxruntime == [[FLOAT32_BUILD, ("CUDAExecutionProvider", {"use_tf32": flag}), "CPUExecutionProvider"]]
    assert os.environ.get(TF32_ENV) == (None if tf32 else "0")
    assert runner.describe() == "onnxruntime[tensorrt,cuda,cpu]" + (" tf32" if tf32 else "")


def test_tf32_variable_set_by_the_user_wins(
    gpu_onnxruntime: list[list[object]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TF32_ENV, "1")
    create_runner("onnxruntime", tmp_path / "m.onnx", providers=("tensorrt", "cpu")).activate()
    assert os.environ[TF32_ENV] == "1" and gpu_onnxruntime == [[FLOAT32_BUILD, "CPUExecutionProvider"]]


def test_runner_options_give_each_runtime_only_its_own_options() -> None:
    everything = {"providers": ("cuda",), "tf32": True, "gpu_precision": "fp32", "cpu_fallback": True}
    assert runner_options("litert", threads=2, **everything) == {"threads": 2}
    assert runner_options("onnxruntime", threads=None, **everything) == {
        "threads": None,
        "providers": ("cuda",),
        "tf32": True,
    }
    assert runner_options("litert-gpu", threads=1, **everything) == {
        "threads": 1,
        "gpu_precision": "fp32",
        "cpu_fallback": True,
    }
