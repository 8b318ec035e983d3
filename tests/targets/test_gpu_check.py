"""targets/desktop-cuda/check.sh: its report and exit code, with real runs on this machine's CPU.

The GPU steps themselves need onnxruntime-gpu on an NVIDIA machine; here the script must refuse
them by name (exit 3) and, given CPU provider sets, run parity and bench for real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pe_export.golden import GoldenOptions, make_golden
from tests.helpers import REPO, shell_lines

SCRIPT = REPO / "targets" / "desktop-cuda" / "check.sh"
EXAMPLE = REPO / "examples" / "gpu-check" / "README.md"


@pytest.fixture(scope="module")
def onnx_and_golden(exported_file, saved_model, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    golden = tmp_path_factory.mktemp("gpu-check") / "golden"
    make_golden(saved_model("encoder_dynamic"), golden, GoldenOptions(samples=4, batch=2))
    return exported_file("encoder_dynamic", "onnx"), golden


def check(model: Path, golden: Path, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("pe-export") is None:
        pytest.fail("pe-export is not on PATH; install the package (pip install -e '.[dev]')")
    return subprocess.run(
        ["bash", str(SCRIPT), str(model), str(golden), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
        check=False,
    )


def test_without_a_gpu_the_examples_commands_fail_by_name(onnx_and_golden: tuple[Path, Path], tmp_path: Path) -> None:
    """examples/gpu-check/README.md's desktop-cuda lines as written, from a folder holding encoder.onnx and golden/
    (and targets/, as the repository root does): on a machine without a GPU each GPU step fails by name, exit 3."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has CUDA: run the script for real instead")
    model, golden = onnx_and_golden
    for name, target in (("encoder.onnx", model), ("golden", golden), ("targets", REPO / "targets")):
        (tmp_path / name).symlink_to(target)
    lines = [line for line in shell_lines(EXAMPLE) if "desktop-cuda/check.sh" in line]
    assert len(lines) == 2, lines
    steps, commands = {}, {}
    for line in lines:
        shutil.rmtree(tmp_path / "gpu-check", ignore_errors=True)
        done = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 3, (line, done.stdout + done.stderr)
        assert "not available in this onnxruntime" in done.stderr
        report = json.loads((tmp_path / "gpu-check" / "report.json").read_text())
        assert report["passed"] is False and report["exit_code"] == 3
        steps[line] = [(s["step"], s["exit_code"], s["result"]) for s in report["steps"]]
        commands.update({s["step"]: s["command"] for s in report["steps"]})
    default, cuda_only = steps.values()
    assert default == [
        ("parity-tensorrt-cuda", 3, None),
        ("bench-tensorrt-cuda", 3, None),
        ("parity-tensorrt-cuda-fp16", 3, None),  # TensorRT as deployed: float16 layers allowed
        ("bench-tensorrt-cuda-fp16", 3, None),
        ("parity-cuda", 3, None),
        ("bench-cuda", 3, None),
    ]
    assert cuda_only == [("parity-cuda", 3, None), ("bench-cuda", 3, None)]
    for step in ("parity-tensorrt-cuda-fp16", "bench-tensorrt-cuda-fp16"):
        assert "--trt-fp16" in commands[step] and "--trt-cache gpu-check/trt-cache" in commands[step]
    assert "--trt-cache gpu-check/trt-cache" in commands["parity-tensorrt-cuda"]
    assert "--trt" not in commands["parity-tensorrt-cuda"].replace("--trt-cache", "")
    assert "--trt" not in commands["bench-cuda"]


def test_cpu_provider_set_runs_parity_and_bench_for_real(onnx_and_golden: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "parity-cpu.json").write_text('{"stale": true}')  # from an earlier run: must not survive
    done = check(*onnx_and_golden, out, PROVIDER_SETS="cpu", BENCH_RUNS="20", BENCH_SEQ_LEN="32", PE_EXPORT_TF32="1")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is True and [s["step"] for s in report["steps"]] == ["parity-cpu", "bench-cpu"]
    parity, bench = (s["result"] for s in report["steps"])
    assert parity["passed"] is True and parity["runtime"] == "onnxruntime[cpu]"  # tf32 means nothing on a CPU
    assert max(o["max_abs"] for o in parity["outputs"]) < 1e-4
    assert bench["latency_ms"]["p50"] > 0 and (bench["runs"], bench["seq_len"]) == (20, 32)
    assert "--tf32" in report["steps"][0]["command"] and not list(out.glob("*.partial"))


def test_a_failing_check_on_a_bundle_with_layers_names_the_layer(saved_model, tmp_path: Path) -> None:
    """The script's layers step (on the GPU: cut files; here the CPU's kept tensors): after a failed parity on a
    bundle written with --layers, report.json says where the file departs."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from pe_export.api import export_onnx
    from pe_export.converters.options import ExportOptions

    golden = tmp_path / "golden"
    make_golden(saved_model("encoder_dynamic"), golden, GoldenOptions(samples=4, batch=2, layers="blocks"))
    exported = export_onnx(saved_model("encoder_dynamic"), tmp_path / "m.onnx", ExportOptions()).output  # mapped
    proto = onnx.load(str(exported))
    weights = {i for node in proto.graph.node if node.op_type == "MatMul" for i in node.input}
    kernel = next(init for init in proto.graph.initializer if init.name in weights and len(init.dims) == 2)
    kernel.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(kernel) * np.float32(1.5), kernel.name))
    altered = tmp_path / "altered.onnx"
    onnx.save(proto, str(altered))
    done = check(altered, golden, tmp_path / "out", PROVIDER_SETS="cpu", BENCH_RUNS="5", BENCH_SEQ_LEN="32")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    steps = {s["step"]: s for s in report["steps"]}
    assert list(steps) == ["parity-cpu", "layers-cpu", "bench-cpu"], done.stderr
    assert [step["exit_code"] for step in steps.values()] == [1, 1, 0], done.stderr
    layers = steps["layers-cpu"]["result"]
    first = next(layer for layer in layers["layers"] if layer["name"] == layers["first_divergence"])
    assert not first["ok"] and all(layer["ok"] for layer in layers["layers"][: layers["layers"].index(first)])


@pytest.mark.slow  # two encoders exported in two precisions, eight checks
def test_the_cuda_kit_checks_each_encoder_and_precision(tmp_path: Path) -> None:
    """prepare.sh and run-kit.sh as the README gives them: the demo and the MiniLM-shaped encoder, float32 and
    float16 ONNX (and the MiniLM-shaped one's static int8 QDQ file, a TensorRT int8 engine on a GPU), each against
    its bundle; on this machine's CPU provider for real (the float16 graph judged by the
    fp16 tolerance), and without a GPU the default provider sets refused by name in every file's report."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has CUDA: run the kit for real instead")
    (tmp_path / "targets").symlink_to(REPO / "targets", target_is_directory=True)
    prepare, run_kit = (line for line in shell_lines(EXAMPLE) if "desktop-cuda/" in line and "check.sh" not in line)
    done = subprocess.run(["bash", "-c", prepare], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    names = ["encoder.fp32", "encoder.float16", "minilm-shaped.fp32", "minilm-shaped.float16", "minilm-shaped.int8"]
    env = {**os.environ, "PROVIDER_SETS": "cpu", "BENCH_RUNS": "3"}
    ran = subprocess.run(["bash", "-c", run_kit], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    report = json.loads((tmp_path / "gpu-results" / "report.json").read_text())
    assert ran.returncode == 0 and report["passed"] and list(report["models"]) == names, ran.stderr[-2000:]
    for name, model in report["models"].items():
        parity, bench = (step["result"] for step in model["steps"])
        precision = "fp16" if "float16" in name else "int8" if "int8" in name else "fp32"
        assert parity["passed"] and parity["precision"] == precision, (name, parity["precision"])
        assert bench["seq_len"] == 32 and bench["latency_ms"]["p50"] > 0
    refused = subprocess.run(["bash", "-c", run_kit], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    report = json.loads((tmp_path / "gpu-results" / "report.json").read_text())
    assert refused.returncode == report["exit_code"] == 3 and not report["passed"]
    for model in report["models"].values():
        assert model["steps"] and all(step["exit_code"] == 3 for step in model["steps"])
        steps = {step["step"] for step in model["steps"]}
        # TensorRT's step per TRT mode (the int8 file's: parity-tensorrt-cuda-int8), and CUDA's own
        assert "parity-cuda" in steps and any(step.startswith("parity-tensorrt-cuda") for step in steps), steps
