"""litert-gpu: LiteRT's CompiledModel on its GPU accelerator, run for real under a software Vulkan.

Mesa's lavapipe (unpacked by targets/software-vulkan/setup.sh, cached between runs) is a Vulkan device
on the CPU; LiteRT's WebGPU accelerator selects it as "llvmpipe" and compiles the demo encoder for it.
Every GPU run goes through `pe-export` in a subprocess, the way a user runs it: the pytest process has
TensorFlow loaded, and a process with TensorFlow cannot create a lavapipe device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pe_export.errors import ExitCode, RuntimeUnavailableError
from pe_export.runners import create_runner, installed_runners
from pe_export.runners.litert_gpu import gpu_log_summary
from tests.helpers import software_vulkan_env

SEQ_LEN = 32

pytestmark = pytest.mark.slow  # exports and a Vulkan set-up: excluded from the quick run


@pytest.fixture(scope="module")
def vulkan_env() -> dict[str, str]:
    return software_vulkan_env()


def bare_converter_file(saved_model: Path, path: Path) -> None:
    """The encoder at batch 1 × SEQ_LEN as the TFLite converter alone writes it: its embedding GATHER reads a
    [1, SEQ_LEN] matrix of ids, which LiteRT's GPU accelerator does not take."""
    from pe_export.native import import_tensorflow

    tf = import_tensorflow()
    loaded = tf.saved_model.load(str(saved_model))

    class Fixed(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, SEQ_LEN], tf.int32, name="token_ids")])
        def serve(self, token_ids):  # type: ignore[no-untyped-def]
            return self.loaded.signatures["serving_default"](token_ids=token_ids)

    module = Fixed()
    module.loaded = loaded  # its variables live as long as the module
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.serve.get_concrete_function()], module)
    path.write_bytes(converter.convert())


@pytest.fixture(scope="module")
def fixed_demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo's trained encoder exported at batch 1 × 32 positions (fp32 and float16; and as the bare converter
    writes it) and its golden bundle."""
    from pe_export.api import export_tflite
    from pe_export.converters.options import ExportOptions
    from pe_export.encoders import task
    from pe_export.golden import GoldenOptions, make_golden

    root = tmp_path_factory.mktemp("gpu")
    task.load_trained_model().export(str(root / "encoder"), verbose=False)
    files = {}
    for quantize in ("none", "float16"):
        files[quantize] = root / f"encoder.{quantize}.tflite"
        export_tflite(root / "encoder", files[quantize], ExportOptions(batch=1, seq_len=SEQ_LEN, quantize=quantize))
    files["converter"] = root / "encoder.converter.tflite"
    bare_converter_file(root / "encoder", files["converter"])
    files["dynamic"] = root / "encoder.dynamic.tflite"
    export_tflite(root / "encoder", files["dynamic"], ExportOptions(verify=False))
    make_golden(root / "encoder", root / "golden", GoldenOptions(batch=1, seq_len=SEQ_LEN))
    files["golden"] = root / "golden"
    make_golden(root / "encoder", root / "layers", GoldenOptions(batch=1, seq_len=SEQ_LEN, layers="all"))
    files["layers"] = root / "layers"
    return files


def pe_export(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pe_export.cli", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={**os.environ, **env},
    )


def gpu_parity(env: dict[str, str], model: Path, golden: Path, tmp_path: Path, *options: str) -> tuple[int, dict]:
    report = tmp_path / "report.json"
    done = pe_export(env, "parity", model, golden, "--runtime", "litert-gpu", "--json", report, "--overwrite", *options)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(report.read_text())


@pytest.mark.parametrize("quantize", ["none", "float16"])
def test_fp32_arithmetic_on_the_gpu_passes_the_fp32_tolerance(vulkan_env, fixed_demo, tmp_path, quantize) -> None:
    # A float16 file's DEQUANTIZEs (and its GATHER of float16 rows) are not the accelerator's: the CPU runs those.
    fallback = ["--cpu-fallback"] if quantize == "float16" else []
    code, report = gpu_parity(
        vulkan_env, fixed_demo[quantize], fixed_demo["golden"], tmp_path, "--gpu-precision", "fp32", *fallback
    )
    logits = report["outputs"][0]
    assert code == ExitCode.OK and report["passed"], logits
    file_precision = "fp32" if quantize == "none" else "fp16"
    assert report["precision"] == file_precision and report["arithmetic"] == "fp32"
    if quantize == "none":  # all of it on the GPU (lavapipe; no CPU fallback allowed), the embedding GATHER too
        assert report["runtime"] == "litert-gpu[fp32 math; llvmpipe; fully accelerated]"
    else:
        assert report["runtime"].startswith("litert-gpu[fp32 math; llvmpipe; GPU ")
        assert "DEQUANTIZE" in report["runtime"]
    if quantize == "none":
        assert logits["max_abs"] < 1e-4 and logits["cosine"] > 0.9999999


def test_default_gpu_arithmetic_is_fp16_and_judged_by_the_fp16_tolerance(vulkan_env, fixed_demo, tmp_path) -> None:
    code, report = gpu_parity(vulkan_env, fixed_demo["none"], fixed_demo["golden"], tmp_path)
    logits = report["outputs"][0]
    assert report["precision"] == "fp16" and report["arithmetic"] == "fp16"
    assert report["runtime"] == "litert-gpu[fp16 math; llvmpipe; fully accelerated]"
    assert report["tolerances"]["logits"] == {"atol": 0.05, "rtol": 0.05, "min_cosine": 0.999}
    # Really half-precision arithmetic (errors far above float32's), close in direction, no zeros or NaNs.
    assert 1e-3 < logits["max_abs"] < 0.5 and logits["cosine"] > 0.9999 and logits["argmax_agreement"] > 0.99
    # The verdict is the figures' (on lavapipe: max abs 0.137 against atol 0.05 + rtol 0.05·|x|, 2 of 8,192
    # logits over, so the default GPU precision fails; another rasterizer may round otherwise).
    tolerance = report["tolerances"]["logits"]
    within = logits["violations"] == 0 and logits["cosine"] >= tolerance["min_cosine"]
    assert (code == ExitCode.OK) == within and report["passed"] == within


def test_layers_on_the_gpu_are_bisected_over_cut_files(vulkan_env, fixed_demo, tmp_path) -> None:
    """The accelerator keeps no intermediate: the file cut at a layer runs whole on it, bisecting for the first
    layer over tolerance. fp32 arithmetic: the last layer passes, one cut file answers for all."""
    layers = json.loads((fixed_demo["layers"] / "manifest.json").read_text())["layers"]
    code, report = gpu_parity(
        vulkan_env,
        fixed_demo["none"],
        fixed_demo["layers"],
        tmp_path,
        "--gpu-precision",
        "fp32",
        "--layers",
    )
    assert code == ExitCode.OK and report["first_divergence"] is None, report["layers"]
    assert "bisected: 1 of" in report["kernels"] and len(report["layers"]) == 1
    assert report["layers"][0]["relative_error"] < 1e-5  # the GPU's fp32 arithmetic, read through the cut
    # fp16 arithmetic (the default): a layer over the fp16 tolerance is named, and the bisection ran only
    # about log2(layers) cut files; the layers it ran before the named one are within tolerance.
    code, report = gpu_parity(vulkan_env, fixed_demo["none"], fixed_demo["layers"], tmp_path, "--layers")
    checked = report["layers"]
    assert len(checked) <= 1 + len(layers).bit_length() and report["precision"] == "fp16"
    assert all(layer["relative_error"] > 1e-5 for layer in checked)  # really half precision, layer by layer
    first = report["first_divergence"]
    if not all(output["within_tolerance"] for output in report["outputs"]):  # a failing run names its layer
        assert first is not None  # (under lavapipe the demo's logits fail: the last LayerNorm is named)
    if first is not None:
        names = [entry["name"] for entry in layers]
        named = next(layer for layer in checked if layer["name"] == first)
        assert not named["ok"] and code == ExitCode.PARITY_FAILED
        assert all(layer["ok"] for layer in checked if names.index(layer["name"]) < names.index(first))
    else:
        assert all(layer["ok"] for layer in checked)


def test_the_failure_line_names_the_gpu_precision(vulkan_env, fixed_demo) -> None:
    # A tolerance float16 arithmetic cannot meet (its error is over 1e-3, above): a failure on any GPU.
    done = pe_export(
        vulkan_env,
        "parity",
        fixed_demo["none"],
        fixed_demo["golden"],
        "--runtime",
        "litert-gpu",
        "--atol",
        "1e-5",
        "--rtol",
        "0",
    )
    assert done.returncode == ExitCode.PARITY_FAILED
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.endswith(
        "computed in fp16 (LiteRT's GPU accelerator has no per-op precision: --gpu-precision fp32 computes every op "
        "in fp32 and checks the file itself)"
    )


def test_ops_the_gpu_lacks_are_refused_unless_the_cpu_may_take_them(vulkan_env, fixed_demo, tmp_path) -> None:
    """A file pe-export did not write: the bare converter's GATHER by a [1, 32] matrix of ids."""
    done = pe_export(vulkan_env, "parity", fixed_demo["converter"], fixed_demo["golden"], "--runtime", "litert-gpu")
    assert done.returncode == ExitCode.RUNTIME_UNAVAILABLE, done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "GATHER: Only support 1D indices" in done.stderr and "--cpu-fallback" in done.stderr
    code, report = gpu_parity(
        vulkan_env, fixed_demo["converter"], fixed_demo["golden"], tmp_path, "--gpu-precision", "fp32", "--cpu-fallback"
    )
    assert code == ExitCode.OK and report["runtime"].startswith("litert-gpu[fp32 math; llvmpipe; GPU ")
    assert report["runtime"].endswith(": GATHER]")  # the report says what fell back


def test_no_vulkan_adapter_is_one_line_exit_3(vulkan_env, fixed_demo, tmp_path) -> None:
    no_driver = {**vulkan_env, "VK_ICD_FILENAMES": str(tmp_path / "no-such-icd.json")}
    done = pe_export(
        no_driver, "parity", fixed_demo["none"], fixed_demo["golden"], "--runtime", "litert-gpu", "--cpu-fallback"
    )
    assert done.returncode == ExitCode.RUNTIME_UNAVAILABLE, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: litert-gpu found no GPU: no Vulkan adapter (is libvulkan.so.1 and a driver's ICD installed?); "
        "targets/software-vulkan/setup.sh gives a machine without a GPU a software one"
    ]


def test_dynamic_shapes_are_refused_before_compiling(vulkan_env, fixed_demo, tmp_path) -> None:
    done = pe_export(vulkan_env, "parity", fixed_demo["dynamic"], fixed_demo["golden"], "--runtime", "litert-gpu")
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    assert "needs fixed input shapes" in done.stderr and "--batch N --seq-len L" in done.stderr
    inspected = pe_export(vulkan_env, "inspect", fixed_demo["dynamic"])
    assert "litert-gpu       NO   the GPU needs fixed input shapes" in inspected.stdout


def test_bench_on_the_gpu(vulkan_env, fixed_demo, tmp_path) -> None:
    result = tmp_path / "bench.json"
    done = pe_export(
        vulkan_env,
        "bench",
        fixed_demo["none"],
        "--runtime",
        "litert-gpu",
        "--gpu-precision",
        "fp32",
        "--runs",
        "10",
        "--warmup",
        "2",
        "--json",
        result,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(result.read_text())
    assert figures["runtime"].startswith("litert-gpu[fp32 math; llvmpipe") and figures["seq_len"] == SEQ_LEN
    assert 0 < figures["latency_ms"]["p50"] <= figures["latency_ms"]["max"]


def test_refused_in_a_process_that_loaded_tensorflow(fixed_demo) -> None:
    from pe_export.native import import_tensorflow

    import_tensorflow()
    runner = create_runner("litert-gpu", fixed_demo["none"], cpu_fallback=True)
    with pytest.raises(RuntimeUnavailableError, match="loaded TensorFlow"):
        runner.activate()


def test_never_the_default_runtime(fixed_demo) -> None:
    assert "litert-gpu" not in installed_runners(fixed_demo["none"])
    assert installed_runners(fixed_demo["none"])[0] == "litert"


def test_compile_log_is_read_for_adapter_partition_and_unsupported_ops() -> None:
    log = (
        "I0000 environment.cc:532] Selected adapter: llvmpipe (LLVM 15.0.6, 256 bits), arch=software\n"
        "ERROR: Following operations are not supported by GPU delegate:\n"
        "DEQUANTIZE: \n"
        "GATHER: Only support 1D indices\n"
        "CUMSUM: Operation is not supported.\n"
        "99 operations will run on the GPU, and the remaining 8 operations will run on the CPU.\n"
        "INFO: [accelerator_registry.cc:43] DestroyAccelerator: ptr=0x1, name=GPU WebGPU\n"
    )
    summary = gpu_log_summary(log)
    assert summary == {
        "adapter": "llvmpipe",
        "gpu_ops": 99,
        "cpu_ops": 8,
        "no_adapter": False,
        "unsupported": {
            "DEQUANTIZE": "not supported",
            "GATHER": "Only support 1D indices",
            "CUMSUM": "Operation is not supported.",
        },
    }
    assert gpu_log_summary("ERROR: Failed to initialize WebGPU environment: INTERNAL: No adapters found")["no_adapter"]


def test_buffers_are_bound_by_name_where_the_signature_is_not_sorted(tmp_path: Path) -> None:
    """CompiledModel keeps the file's input order (zeta, alpha); the CPU interpreter's signature lists them
    sorted. Bound by position, zeta took alpha's values. Run here on CompiledModel's CPU accelerator: the
    binding is the same code the GPU path uses."""
    import numpy as np

    from pe_export.native import import_tensorflow
    from pe_export.runners.litert import LiteRTRunner
    from pe_export.runners.litert_gpu import buffers_by_name

    tf = import_tensorflow()

    class Unsorted(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([1, 4], tf.float32, name="zeta"),
                tf.TensorSpec([1, 4], tf.float32, name="alpha"),
            ]
        )
        def serve(self, zeta, alpha):  # type: ignore[no-untyped-def]
            return {"out_b": zeta * 2.0 + alpha, "out_a": zeta - alpha}

    module = Unsorted()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.serve.get_concrete_function()], module)
    path = tmp_path / "unsorted.tflite"
    path.write_bytes(converter.convert())
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator
    from ai_edge_litert.options import Options

    model = CompiledModel.from_file(str(path), options=Options(hardware_accelerators=HardwareAccelerator.CPU))
    assert model.get_signature_by_index(0)["inputs"] == ["zeta", "alpha"]  # the file's order
    reader = LiteRTRunner(path)
    reader.activate()
    inputs, outputs = reader.input_specs(), reader.output_specs()
    reader.deactivate()
    assert [spec.name for spec in inputs] != ["zeta", "alpha"]  # what was zipped with it, by position
    key, (in_buffers, out_buffers) = buffers_by_name(model, inputs, outputs)
    zeta, alpha = np.full((1, 4), 3.0, np.float32), np.full((1, 4), 1.0, np.float32)
    in_buffers["zeta"].write(zeta)
    in_buffers["alpha"].write(alpha)
    model.run_by_name(key, in_buffers, out_buffers)
    np.testing.assert_array_equal(out_buffers["out_b"].read(4, np.dtype("float32")), (2 * zeta + alpha).ravel())
    np.testing.assert_array_equal(out_buffers["out_a"].read(4, np.dtype("float32")), (zeta - alpha).ravel())
