"""TensorRT's modes through onnxruntime (--trt-fp16, --trt-int8, --trt-cache, the optimization profile): what
reaches TensorrtExecutionProvider from `pe-export parity` and `pe-export bench`, and how the run is judged.

This machine has no NVIDIA GPU: onnxruntime's session is faked to record the providers it is given and then
computes on the real CPU provider, so the file, the bundle and the verdict are real; only the GPU is not. The real
path is targets/desktop-cuda/check.sh and the Jetson benchmark, on the hardware."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from pe_export.errors import ExitCode
from pe_export.runners import create_runner
from pe_export.runners.onnxrt import TensorrtBuild, shape_profile
from tests.helpers import assert_one_line_error, run_cli

GPU_PROVIDERS = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


class GpuSession:
    """onnxruntime's InferenceSession as on a GPU machine: records the providers asked, runs on the CPU."""

    made: ClassVar[list[list[Any]]] = []

    def __init__(self, model: Any, sess_options: Any = None, providers: Any = None) -> None:
        import onnxruntime as ort

        GpuSession.made.append(list(providers or []))
        self._session = ort.capi.onnxruntime_inference_collection.InferenceSession(
            model, sess_options=sess_options, providers=["CPUExecutionProvider"]
        )

    def get_providers(self) -> list[str]:
        return GPU_PROVIDERS

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


@pytest.fixture
def gpu_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    import onnxruntime as ort

    monkeypatch.setattr(ort, "get_available_providers", lambda: GPU_PROVIDERS)
    monkeypatch.setattr(ort, "InferenceSession", GpuSession)
    GpuSession.made.clear()
    return GpuSession.made


def tensorrt_options(made: list[list[Any]]) -> dict[str, str]:
    """The options TensorrtExecutionProvider got, in the one session made with it."""
    entries = [entry for providers in made for entry in providers if isinstance(entry, tuple)]
    found = [options for name, options in entries if name == "TensorrtExecutionProvider"]
    assert len(found) == 1, made
    return dict(found[0])


def test_the_build_options_tensorrt_gets() -> None:
    profile = shape_profile([{"ids": np.zeros((2, 7))}, {"ids": np.zeros((2, 16))}])
    assert profile == {"ids": ((2, 7), (2, 16), (2, 16))}
    assert TensorrtBuild().provider_options() == {"trt_fp16_enable": "0", "trt_int8_enable": "0"}
    options = TensorrtBuild(fp16=True, int8=True, cache="/c", profile=profile).provider_options()
    assert options == {
        "trt_fp16_enable": "1",
        "trt_int8_enable": "1",
        "trt_int8_use_native_calibration_table": "0",  # the scales are the file's Q/DQ nodes'
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": "/c",
        "trt_timing_cache_enable": "1",
        "trt_timing_cache_path": "/c",
        "trt_profile_min_shapes": "ids:2x7",
        "trt_profile_opt_shapes": "ids:2x16",
        "trt_profile_max_shapes": "ids:2x16",
    }


def test_parity_passes_the_modes_and_the_bundles_shapes_and_judges_by_fp16(
    gpu_onnxruntime: list[list[Any]],
    exported_file,
    saved_model,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from pe_export.golden import GoldenOptions, make_golden

    model = exported_file("encoder_multi_io", "onnx")
    golden = tmp_path / "golden"
    make_golden(saved_model("encoder_multi_io"), golden, GoldenOptions(samples=4, batch=2, seq_len=12))
    cache = tmp_path / "engines"
    args = ("parity", model, golden, "--providers", "tensorrt,cuda,cpu", "--no-isolate", "--json", tmp_path / "p.json")
    result = run_cli(capfd, *args, "--trt-fp16", "--trt-cache", cache)
    assert result.exit_code == ExitCode.OK, result.stderr
    options = tensorrt_options(gpu_onnxruntime)
    shapes = ",".join(f"{name}:2x12" for name in ("attention_mask", "segment_ids", "token_ids"))
    assert options["trt_fp16_enable"] == "1" and options["trt_int8_enable"] == "0"
    assert options["trt_engine_cache_path"] == str(cache.resolve()) and cache.is_dir()
    assert options["trt_profile_min_shapes"] == options["trt_profile_max_shapes"] == shapes
    report = json.loads((tmp_path / "p.json").read_text())
    # a float32 file through a float16 build: judged by the fp16 tolerance, and the report says what ran
    assert report["precision"] == "fp16" and report["runtime"] == "onnxruntime[tensorrt,cuda,cpu] trt-fp16 engine-cache"
    assert report["arithmetic_remedy"] == "without --trt-fp16 TensorRT builds the file's own precision"
    gpu_onnxruntime.clear()
    plain = run_cli(capfd, *args, "--overwrite")
    assert plain.exit_code == ExitCode.OK
    assert tensorrt_options(gpu_onnxruntime)["trt_fp16_enable"] == "0"  # float32 unless asked
    assert json.loads((tmp_path / "p.json").read_text())["precision"] == "fp32"


def test_bench_passes_the_timed_shape_as_the_profile(
    gpu_onnxruntime: list[list[Any]], exported_file, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    model = exported_file("encoder_dynamic", "onnx")
    result = run_cli(
        capfd,
        "bench",
        model,
        "--providers",
        "tensorrt,cuda,cpu",
        "--trt-int8",
        "--batch",
        "3",
        "--seq-len",
        "20",
        "--runs",
        "3",
        "--json",
        tmp_path / "b.json",
    )
    assert result.exit_code == ExitCode.OK, result.stderr
    options = tensorrt_options(gpu_onnxruntime)
    assert options["trt_int8_enable"] == "1" and options["trt_fp16_enable"] == "0"
    assert options["trt_profile_min_shapes"] == options["trt_profile_opt_shapes"] == "token_ids:3x20"
    assert json.loads((tmp_path / "b.json").read_text())["runtime"] == "onnxruntime[tensorrt,cuda,cpu] trt-int8"


@pytest.mark.parametrize("command", ["parity", "bench"])
def test_tensorrt_modes_without_the_tensorrt_provider_are_refused(
    command: str, exported_file, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    model = exported_file("encoder_dynamic", "onnx")
    args = (command, model, *([tmp_path] if command == "parity" else []), "--providers", "cuda,cpu", "--trt-fp16")
    result = run_cli(capfd, *args)
    assert_one_line_error(result, ExitCode.BAD_INPUT, "--trt-fp16", "do not include tensorrt")


def test_the_runner_makes_the_cache_folder_and_says_what_it_builds(
    gpu_onnxruntime: list[list[Any]], exported_file, tmp_path: Path
) -> None:
    cache = tmp_path / "deep" / "engines"
    build = TensorrtBuild(fp16=True, cache=str(cache))
    model = exported_file("encoder_dynamic", "onnx")
    runner = create_runner("onnxruntime", model, providers=("tensorrt",), tensorrt=build)
    with runner:
        assert cache.is_dir() and runner.describe() == "onnxruntime[tensorrt] trt-fp16 engine-cache"
    assert tensorrt_options(gpu_onnxruntime)["trt_engine_cache_enable"] == "1"
